"""An HTTP endpoint for a trained model, with LitServe: ``python main.py serve --ckpt_path REF [--task ...]``.

``POST /predict`` with a JSON body does what the command of the same task does, for one input, and answers with
the same row as JSON:
- ``predict`` (a fine-tuned run): the request body of its task kind's input form (``task_kinds.forms``:
  ``{"text": "..."}``, ``{"question": "...", "context": "..."}`` for extractive QA, ``{"question": "...",
  "choices": [...]}`` for multiple choice) -> the row ``predict`` prints (``task_kinds.rows``);
- ``embed`` (any encoder): ``{"text": "..."}`` -> ``{"text", "embedding"}`` (``inference.embed``);
- ``generate`` (a causal or seq2seq LM): ``{"prompt": "...", "max_new_tokens": 64, "do_sample": false, ...}``
  -> ``{"prompt", "generated"}`` (``inference.generate``; the request's decoding settings, seed included).
The default task follows the model: ``predict`` for the heads ``predict`` serves, ``generate`` for language
models, ``embed`` otherwise.

Requests arriving within ``batch_timeout`` seconds of each other are run as one batch of up to ``max_batch_size``
(LitServe's dynamic batching); ``workers`` inference processes each hold the model.  ``GET /health`` answers
200 ``ok`` once every worker has loaded it.  A body that is not JSON (400), lacks a field or has the wrong type
(422), a text over the limit with ``--too_long refuse`` (413), a body over ``--max_request_bytes`` (413, before it
is read), a generate request beyond the model's positions (400) get ``{"error": "<one line>"}``, as does every other
error (404, 500 ...); the other requests of its batch are answered as if it had not been sent, and the server keeps
serving.  SIGTERM (and SIGINT) stop the server and every process it started; on Linux they also end if the server
process is killed.
"""
# no ``from __future__ import annotations``: LitServe reads decode_request's annotation as the request model
import errno
import json
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any, Literal, Optional

import litserve as ls
from pydantic import BaseModel

from ptm_app.errors import PtmError
from ptm_app.task_kinds.registry import forms

TASKS = ("predict", "embed", "generate")
MAX_REQUEST_BYTES = 2 * 2**20  # a request holds one input: 2 MiB is far beyond any model's positions


class TextRequest(BaseModel):
    text: str


class PromptRequest(BaseModel):
    prompt: str
    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    num_beams: int = 1
    seed: Optional[int] = None
    chat: bool = False


@dataclass
class Item:
    """One decoded request: the example as the task's runner takes it, and the text to echo back."""

    example: Any
    shown: Optional[str] = None


@dataclass
class Refused:
    """A request answered with an error status and one line, without failing its batch."""

    status: int
    message: str


@dataclass
class ServeSettings:
    ckpt_path: str
    task: str
    kind: str  # what one request holds: a task kind's input form (task_kinds.forms: "text", "words", ...) or "prompt"
    too_long: str = "truncate"
    max_length: Optional[int] = None
    pooling: Optional[str] = None
    normalize: bool = False
    backend: str = "torch"
    threads: int = 1
    trust_checkpoint: bool = False
    parent_pid: Optional[int] = None  # the serve process: a worker ends with it (``die_with_parent``)


def refusal(exc: PtmError) -> Refused:
    """A worker-side refusal: a text over the limit (413, ``--too_long refuse``) or bad settings (400)."""
    message = str(exc)
    if "longer than" in message:  # predictors.check_lengths: say it to the client, not as a command-line fix
        return Refused(413, message.replace("input 1 is", "the text is").split("; ")[0] + "; send a shorter one")
    return Refused(400, message)


class ModelAPI(ls.LitAPI):
    """The shared part: load in each worker, run a batch, answer refused requests with their status."""

    def __init__(self, settings: ServeSettings, **kwargs):
        super().__init__(**kwargs)
        self.settings = settings
        self.loaded = None

    def setup(self, device) -> None:
        import torch

        from ptm_app.inference.loading import load_for_inference

        if self.settings.parent_pid is not None:
            die_with_parent(self.settings.parent_pid)
        torch.set_num_threads(self.settings.threads)
        self.loaded = load_for_inference(self.settings.ckpt_path, self.settings.trust_checkpoint)
        if self.settings.backend == "onnxruntime":
            from ptm_app.inference.onnx_export import open_session

            self.loaded.session = open_session(self.loaded)

    def batch(self, inputs: list) -> list:
        return list(inputs)

    def unbatch(self, output: list) -> list:
        return list(output)

    def predict(self, x):
        single = not isinstance(x, list)
        items = [x] if single else x
        out: list = list(items)
        todo = [i for i, item in enumerate(items) if isinstance(item, Item)]
        try:
            rows = self.run([items[i] for i in todo]) if todo else []
        except PtmError:  # one request over the limit (or otherwise refused): answer each on its own
            rows = []
            for i in todo:
                try:
                    rows.extend(self.run([items[i]]))
                except PtmError as exc:
                    rows.append(refusal(exc))
        for i, row in zip(todo, rows):
            out[i] = row
        return out[0] if single else out

    def run(self, items: list[Item]) -> list:
        import torch

        from ptm_app.inference.embed import embed_texts
        from ptm_app.inference.predict import predict_rows

        s = self.settings
        with torch.no_grad():
            if s.task == "predict":
                shown = [item.shown for item in items]
                shown = None if any(text is None for text in shown) else shown
                return predict_rows(self.loaded, [item.example for item in items], None, len(items), s.max_length,
                                    s.too_long, shown)
            if s.task == "embed":
                texts = [item.example for item in items]
                vectors = embed_texts(self.loaded, texts, s.pooling, s.normalize, len(texts), s.max_length)
                return [{"text": t, "embedding": [float(v) for v in vector]} for t, vector in zip(texts, vectors)]
            return [self.generate(item.example) for item in items]

    def generate(self, request: dict) -> dict:
        from ptm_app.inference.generate import check_positions, decoding_settings, generate_ids, prompt_inputs

        settings = decoding_settings(self.loaded, request["max_new_tokens"], request["do_sample"],
                                     request["temperature"], request["top_k"], request["top_p"], request["num_beams"])
        inputs = prompt_inputs(self.loaded, request["prompt"], request["chat"])
        check_positions(self.loaded, inputs, request["max_new_tokens"])
        ids = generate_ids(self.loaded, inputs, settings, request["seed"])
        return {"prompt": request["prompt"],
                "generated": self.loaded.tokenizer.decode(ids[0], skip_special_tokens=True)}

    def encode_response(self, output):
        if isinstance(output, Refused):
            from fastapi.responses import JSONResponse

            return JSONResponse(status_code=output.status, content={"error": output.message})
        return output


class TextAPI(ModelAPI):
    """Requests holding one text (``embed``; ``predict`` of a text kind takes the same, ``form_api``)."""

    def decode_request(self, request: TextRequest):
        return Item(request.text, request.text)


class PromptAPI(ModelAPI):
    def decode_request(self, request: PromptRequest):
        return Item(request.model_dump())


def form_api(form) -> type:
    """The API class of a task kind's input form (``task_kinds.forms.InputForm``): its request model built from the
    form's fields, each request decoded by the form (a PtmError answers 422).  Defined at import, as module
    attributes, so worker processes find them by name."""
    from pydantic import create_model

    model = create_model(f"{form.name.title()}FormRequest", **{name: (kind, ...) for name, kind in form.fields.items()})
    model.__module__ = __name__

    def decode_request(self, request):
        try:
            example, shown = form.decode(request.model_dump())
        except PtmError as exc:
            return Refused(422, str(exc))
        return Item(example, shown)

    decode_request.__annotations__ = {"request": model}
    name = f"{form.name.title()}FormAPI"
    api = type(name, (ModelAPI,), {"decode_request": decode_request, "__module__": __name__, "__qualname__": name})
    globals()[model.__name__], globals()[name] = model, api
    return api


API_CLASSES = {**{name: form_api(form) for name, form in forms().items()}, "prompt": PromptAPI}
EXAMPLES = {**{name: form.example for name, form in forms().items()}, "prompt": '{"prompt": "..."}'}


def choose_task(loaded, task: Optional[str]) -> tuple[str, str]:
    """``(task, kind)`` for the loaded model; a task it cannot do is one line (checked before any worker starts)."""
    from ptm_app.inference.generate import GENERATING_MODEL_CLASSES, check_generator
    from ptm_app.inference.predict import predicting_kind
    from ptm_app.task_kinds.registry import kind_of

    if task is None:
        generates = loaded.model_class in GENERATING_MODEL_CLASSES
        task = "predict" if kind_of(loaded) else "generate" if generates else "embed"
    if task == "predict":
        return task, predicting_kind(loaded).prediction.form.name
    if task == "generate":
        check_generator(loaded)
        return task, "prompt"
    return task, "text"


def validation_message(exc, kind: str) -> tuple[int, str]:
    """One line for FastAPI's request validation errors: invalid JSON (400) or a missing / mistyped field (422)."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    example = EXAMPLES[kind]
    if first.get("type") == "json_invalid":
        return 400, f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'cannot parse it')}); " \
                    f"send {example}"
    field = ".".join(str(p) for p in first.get("loc", ())[1:])
    if not field:
        return 422, f"the request body must be a JSON object (Content-Type: application/json); send {example}"
    if first.get("type") == "missing":
        return 422, f"the request lacks the field '{field}'; send {example}"
    return 422, f"field '{field}': {first.get('msg', 'invalid value')}; send {example}"


def check_port(host: str, port: int) -> None:
    """A port already taken is one line, before anything is loaded."""
    if not 1024 <= port <= 65535:
        raise PtmError(f"--port {port}: use a port from 1024 to 65535")
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: closed connections are no use
    try:
        probe.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PtmError(f"port {port} is in use on {host}; pass --port with a free one (or stop the process "
                           f"using it)") from None
        raise PtmError(f"cannot listen on {host}:{port} ({exc.strerror}); pass another --host / --port") from None
    finally:
        probe.close()


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 ``{"error": ...}`` before it is read
    (a declared ``Content-Length``) or as soon as the bytes received pass the cap (a chunked body); the body of
    one under the cap is handed on unchanged."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self.refuse(send)
        received, size = [], 0
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await self.refuse(send)
            if not message.get("more_body", False):
                break

        async def replay():
            return received.pop(0) if received else await receive()

        await self.app(scope, replay, send)

    async def refuse(self, send) -> None:
        body = json.dumps({"error": f"the request body is over {self.max_bytes} bytes (--max_request_bytes); "
                                    f"send one input per request"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def error_message(status: int, detail, path: str) -> str:
    """One line for an HTTP error raised outside our own refusals (FastAPI's 404 / 405, LitServe's 500 / 504)."""
    if status == 404:
        return f"no endpoint {path}; POST /predict with JSON, or GET /health"
    if status == 405:
        return f"method not allowed on {path}; POST /predict with JSON, or GET /health"
    text = detail if isinstance(detail, str) else json.dumps(detail)
    return " ".join(str(text).split()) or f"HTTP {status}"


def build_server(settings: ServeSettings, max_batch_size: int, batch_timeout: float, workers: int,
                 timeout: float, max_request_bytes: int = MAX_REQUEST_BYTES) -> ls.LitServer:
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    api = API_CLASSES[settings.kind](settings, max_batch_size=max_batch_size, batch_timeout=batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=workers, timeout=timeout,
                          middlewares=[(BodyLimit, {"max_bytes": max_request_bytes})])

    async def refuse(request, exc):
        status, message = validation_message(exc, settings.kind)
        return JSONResponse(status_code=status, content={"error": message})

    async def http_error(request, exc):  # every error as {"error": ...}, never FastAPI's {"detail": ...}
        return JSONResponse(status_code=exc.status_code, headers=getattr(exc, "headers", None),
                            content={"error": error_message(exc.status_code, exc.detail, request.url.path)})

    async def internal_error(request, exc):
        return JSONResponse(status_code=500, content={"error": f"internal server error ({type(exc).__name__}); "
                                                               f"see the server's log"})

    server.app.add_exception_handler(RequestValidationError, refuse)
    server.app.add_exception_handler(HTTPException, http_error)
    server.app.add_exception_handler(Exception, internal_error)
    return server


def die_with_parent(parent_pid: int) -> None:
    """Linux: this process (a worker the server started) gets SIGTERM when the server process ends, however it ends
    (``prctl(PR_SET_PDEATHSIG)``), so no worker keeps serving the port after it; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the server ended before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def forked_child(parent_pid: int) -> None:
    """In a process forked from the server (an API server, LitServe's manager): SIGTERM back to its default (uvicorn
    installs its own while it serves), and ended with the server (``die_with_parent``).  Processes forked further
    down are left alone."""
    if os.getppid() != parent_pid:
        return
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # forked from a thread other than the main one: that thread's handlers are not ours to set
        pass
    die_with_parent(parent_pid)


def stop_on_sigterm(server: ls.LitServer):
    """A SIGTERM handler that stops ``server`` as its ``/shutdown`` endpoint would: LitServe's shutdown event is set
    (from a thread of its own: the main thread may be inside a call to the same manager), its wait returns, and
    LitServe's graceful shutdown terminates and joins its API servers and inference workers.  Before the API servers
    run (workers still loading the model), a KeyboardInterrupt: ``serve`` then ends them.  Further SIGTERMs are
    ignored."""

    def handler(signum, frame) -> None:
        import multiprocessing
        import threading

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        event = getattr(server, "_shutdown_event", None)
        serving = any(p.name.startswith("LitServer-") for p in multiprocessing.active_children())
        if event is None or not serving:
            raise KeyboardInterrupt
        threading.Thread(target=event.set, name="serve-sigterm", daemon=True).start()

    return handler


def end_children() -> None:
    """Terminate, then kill, the processes this one started that are still alive (a shutdown cut short)."""
    import multiprocessing

    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join(timeout=5)


def serve(ckpt_path: str, task: Optional[Literal[TASKS]] = None,
          host: Literal["127.0.0.1", "0.0.0.0", "::"] = "127.0.0.1", port: int = 8000, workers: int = 1,
          max_batch_size: int = 8, batch_timeout: float = 0.01, timeout: float = 60.0,
          too_long: Literal["truncate", "refuse"] = "truncate", max_length: Optional[int] = None,
          pooling: Optional[Literal["cls", "mean", "scalar_mix"]] = None, normalize: bool = False,
          backend: Literal["torch", "onnxruntime"] = "torch", trust_checkpoint: bool = False,
          max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
    """An HTTP endpoint (LitServe): POST /predict with JSON, GET /health.

    Checks the port and the model, then serves until SIGTERM or SIGINT, which end every process it started.

    Args:
        ckpt_path: a run directory, .ckpt, export directory or prepared model.
        task: default: predict for fine-tuned heads, generate for language models, embed otherwise.
        host: 127.0.0.1: this machine only; 0.0.0.0: every interface.
        port: the TCP port.
        workers: inference processes, each with its own copy of the model.
        max_batch_size: requests run together as one batch.
        batch_timeout: seconds a worker waits to fill a batch.
        timeout: seconds a request may wait for its answer.
        too_long: texts over the run's limit: truncate them, or answer 413.
        max_length: the input limit in tokens (default: the run's).
        pooling: embed: as embed --pooling.
        normalize: embed: unit-length vectors.
        backend: predict: run the export directory's model.onnx.
        trust_checkpoint: read a checkpoint you made yourself even if it holds more than plain data (runs its code).
        max_request_bytes: larger request bodies are answered 413 unread.
    """
    from ptm_app.inference.loading import load_for_inference

    if workers < 1 or max_batch_size < 1 or batch_timeout < 0 or timeout <= 0 or max_request_bytes < 1:
        raise PtmError("--workers, --max_batch_size and --max_request_bytes must be at least 1, --batch_timeout 0 or "
                       "more, --timeout above 0")
    if too_long not in ("truncate", "refuse"):
        raise PtmError(f"--too_long {too_long}: use truncate or refuse")
    check_port(host, port)
    loaded = load_for_inference(ckpt_path, trust_checkpoint)
    task, kind = choose_task(loaded, task)
    if backend == "onnxruntime":
        if task != "predict":
            raise PtmError("--backend onnxruntime serves predict (the exported head); drop it for embed / generate")
        from ptm_app.inference.onnx_export import open_session

        open_session(loaded)  # no model.onnx: one line now, not in every worker
    threads = max(1, (os.cpu_count() or 1) // workers)
    settings = ServeSettings(ckpt_path, task, kind, too_long, max_length, pooling, normalize, backend, threads,
                             trust_checkpoint, os.getpid())
    server = build_server(settings, max_batch_size, batch_timeout, workers, timeout, max_request_bytes)
    del loaded  # each worker loads its own copy
    print(f"serving {ckpt_path} ({task}) on http://{host}:{port}/predict, health at /health; "
          f"send {EXAMPLES[kind]}", flush=True)
    parent = os.getpid()
    os.register_at_fork(after_in_child=lambda: forked_child(parent))  # LitServe's API servers are forked
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm(server))
    try:
        server.run(host=host, port=port, log_level="warning", generate_client_file=False, num_api_servers=1)
    except KeyboardInterrupt:  # before LitServe's own shutdown was in place (workers still starting)
        pass
    finally:
        end_children()
        signal.signal(signal.SIGTERM, previous)
    print("serve stopped", flush=True)
