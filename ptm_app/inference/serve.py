"""An HTTP endpoint for a trained model, with LitServe: ``python main.py serve --ckpt_path REF [--task ...]``.

``POST /predict`` with a JSON body does what the command of the same task does, for one input, and answers with
the same row as JSON:
- ``predict`` (a fine-tuned run): ``{"text": "..."}`` (``{"question": "...", "context": "..."}`` for extractive
  QA) -> the row ``predict --text`` prints (``inference.predictors``);
- ``embed`` (any encoder): ``{"text": "..."}`` -> ``{"text", "embedding"}`` (``inference.embed``);
- ``generate`` (a causal or seq2seq LM): ``{"prompt": "...", "max_new_tokens": 64, "do_sample": false, ...}``
  -> ``{"prompt", "generated"}`` (``inference.generate``; the request's decoding settings, seed included).
The default task follows the model: ``predict`` for the heads ``predict`` serves, ``generate`` for language
models, ``embed`` otherwise.

Requests arriving within ``batch_timeout`` seconds of each other are run as one batch of up to ``max_batch_size``
(LitServe's dynamic batching); ``workers`` inference processes each hold the model.  ``GET /health`` answers
200 ``ok`` once every worker has loaded it.  A body that is not JSON (400), lacks a field or has the wrong type
(422), or a text over the limit with ``--too_long refuse`` (413) gets ``{"error": "<one line>"}``; the other
requests of its batch are answered as if it had not been sent, and the server keeps serving.
"""
# no ``from __future__ import annotations``: LitServe reads decode_request's annotation as the request model
import argparse
import errno
import os
import socket
from dataclasses import dataclass
from typing import Any, Optional

import litserve as ls
from pydantic import BaseModel

from ptm_app.errors import PtmError

TASKS = ("predict", "embed", "generate")


class TextRequest(BaseModel):
    text: str


class QuestionRequest(BaseModel):
    question: str
    context: str


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
    kind: str  # what one request holds: "text", "words", "qa" or "prompt"
    too_long: str = "truncate"
    max_length: Optional[int] = None
    pooling: Optional[str] = None
    normalize: bool = False
    backend: str = "torch"
    threads: int = 1
    trust_checkpoint: bool = False


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
                shown = None if s.kind == "qa" else [item.shown for item in items]
                return predict_rows(self.loaded, [item.example for item in items], None, len(items), s.max_length,
                                    s.too_long, shown)
            if s.task == "embed":
                texts = [item.example for item in items]
                vectors = embed_texts(self.loaded, texts, s.pooling, s.normalize, len(texts), s.max_length)
                return [{"text": t, "embedding": [float(v) for v in vector]} for t, vector in zip(texts, vectors)]
            return [self.generate(item.example) for item in items]

    def generate(self, request: dict) -> dict:
        from ptm_app.inference.generate import decoding_settings, generate_ids, prompt_inputs

        settings = decoding_settings(self.loaded, request["max_new_tokens"], request["do_sample"],
                                     request["temperature"], request["top_k"], request["top_p"], request["num_beams"])
        inputs = prompt_inputs(self.loaded, request["prompt"], request["chat"])
        ids = generate_ids(self.loaded, inputs, settings, request["seed"])
        return {"prompt": request["prompt"],
                "generated": self.loaded.tokenizer.decode(ids[0], skip_special_tokens=True)}

    def encode_response(self, output):
        if isinstance(output, Refused):
            from fastapi.responses import JSONResponse

            return JSONResponse(status_code=output.status, content={"error": output.message})
        return output


class TextAPI(ModelAPI):
    def decode_request(self, request: TextRequest):
        if self.settings.kind == "words":
            return Item(request.text.split(), request.text) if request.text.split() else \
                Refused(422, "'text' holds no words; send {\"text\": \"...\"} with at least one word")
        return Item(request.text, request.text)


class QuestionAPI(ModelAPI):
    def decode_request(self, request: QuestionRequest):
        return Item((request.question, request.context))


class PromptAPI(ModelAPI):
    def decode_request(self, request: PromptRequest):
        return Item(request.model_dump())


API_CLASSES = {"text": TextAPI, "words": TextAPI, "qa": QuestionAPI, "prompt": PromptAPI}
EXAMPLES = {"text": '{"text": "..."}', "words": '{"text": "..."}', "qa": '{"question": "...", "context": "..."}',
            "prompt": '{"prompt": "..."}'}


def choose_task(loaded, task: Optional[str]) -> tuple[str, str]:
    """``(task, kind)`` for the loaded model; a task it cannot do is one line (checked before any worker starts)."""
    from ptm_app.inference.generate import GENERATING_HEADS, check_generator
    from ptm_app.inference.predictors import predictor_for, predictor_key

    if task is None:
        task = "predict" if predictor_key(loaded) else "generate" if loaded.head in GENERATING_HEADS else "embed"
    if task == "predict":
        return task, predictor_for(loaded).inputs
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
    try:
        probe.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PtmError(f"port {port} is in use on {host}; pass --port with a free one (or stop the process "
                           f"using it)") from None
        raise PtmError(f"cannot listen on {host}:{port} ({exc.strerror}); pass another --host / --port") from None
    finally:
        probe.close()


def build_server(settings: ServeSettings, max_batch_size: int, batch_timeout: float, workers: int,
                 timeout: float) -> ls.LitServer:
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    api = API_CLASSES[settings.kind](settings, max_batch_size=max_batch_size, batch_timeout=batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=workers, timeout=timeout)

    async def refuse(request, exc):
        status, message = validation_message(exc, settings.kind)
        return JSONResponse(status_code=status, content={"error": message})

    server.app.add_exception_handler(RequestValidationError, refuse)
    return server


def serve(ckpt_path: str, task: Optional[str] = None, host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
          max_batch_size: int = 8, batch_timeout: float = 0.01, timeout: float = 60.0, too_long: str = "truncate",
          max_length: Optional[int] = None, pooling: Optional[str] = None, normalize: bool = False,
          backend: str = "torch", trust_checkpoint: bool = False) -> None:
    """Check the port and the model, then serve until interrupted."""
    from ptm_app.inference.loading import load_for_inference

    if workers < 1 or max_batch_size < 1 or batch_timeout < 0 or timeout <= 0:
        raise PtmError("--workers and --max_batch_size must be at least 1, --batch_timeout 0 or more, "
                       "--timeout above 0")
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
                             trust_checkpoint)
    server = build_server(settings, max_batch_size, batch_timeout, workers, timeout)
    del loaded  # each worker loads its own copy
    print(f"serving {ckpt_path} ({task}) on http://{host}:{port}/predict, health at /health; "
          f"send {EXAMPLES[kind]}", flush=True)
    server.run(host=host, port=port, log_level="warning", generate_client_file=False, num_api_servers=1)


def serve_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="main.py serve", description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt_path", required=True, help="a run directory, .ckpt, export directory or prepared model")
    parser.add_argument("--task", choices=TASKS, help="default: predict for fine-tuned heads, generate for language "
                        "models, embed otherwise")
    parser.add_argument("--host", default="127.0.0.1", choices=("127.0.0.1", "0.0.0.0", "::"),
                        help="127.0.0.1: this machine only (default); 0.0.0.0: every interface")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="inference processes, each with its own copy")
    parser.add_argument("--max_batch_size", type=int, default=8, help="requests run together as one batch")
    parser.add_argument("--batch_timeout", type=float, default=0.01,
                        help="seconds a worker waits to fill a batch")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a request may wait for its answer")
    parser.add_argument("--too_long", choices=("truncate", "refuse"), default="truncate",
                        help="texts over the run's limit: truncate them, or answer 413")
    parser.add_argument("--max_length", type=int, help="the input limit in tokens (default: the run's)")
    parser.add_argument("--pooling", choices=("cls", "mean", "scalar_mix"), help="embed: as embed --pooling")
    parser.add_argument("--normalize", action="store_true", help="embed: unit-length vectors")
    parser.add_argument("--backend", choices=("torch", "onnxruntime"), default="torch",
                        help="predict: run the export directory's model.onnx")
    parser.add_argument("--trust_checkpoint", action="store_true",
                        help="read a checkpoint you made yourself even if it holds more than plain data (runs its code)")
    args = parser.parse_args(argv)
    serve(**vars(args))
    return 0
