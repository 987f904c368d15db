"""``main.py serve`` (LitServe): started on a free port in a subprocess, concurrent requests from several threads
get the rows ``predict`` computes, bad requests get a 4xx with one line and the next good request is served, and
a port in use is one line."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import litserve  # noqa: F401  (the `serve` extra, installed by make setup: a missing one fails, never skips)
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_healthy(port: int, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode}): {proc.stdout.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200 and response.read() == b"ok":
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise AssertionError("the server did not become healthy")


def main_py(*args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "main.py", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_served_classifier_answers_concurrent_requests_as_predict_and_survives_bad_ones(classifier_run, tiny_corpus):
    from ptm_app.inference.loading import load_for_inference
    from ptm_app.inference.predict import predict_rows

    docs = [json.loads(line) for line in (tiny_corpus / "test.jsonl").read_text().splitlines()]
    texts = [" ".join(d["text"].split()[:8]) for d in docs] + [" ".join(d["text"].split()[-6:]) for d in docs[:2]]
    expected = predict_rows(load_for_inference(str(classifier_run)), texts, texts=texts, too_long="refuse")
    assert len({round(r["probs"]["pos"], 4) for r in expected}) > 1  # the texts really differ to the model

    port = free_port()
    server = main_py("serve", "--ckpt_path", str(classifier_run), "--port", str(port), "--max_batch_size", "4",
                     "--batch_timeout", "0.05", "--too_long", "refuse")
    try:
        wait_healthy(port, server)
        with ThreadPoolExecutor(max_workers=4) as pool:  # 12 requests from 4 threads: batches of up to 4
            answers = list(pool.map(lambda t: post(port, json.dumps({"text": t}).encode()), texts))
        for (status, row), want in zip(answers, expected):
            assert status == 200 and row["text"] == want["text"] and row["label"] == want["label"]
            assert row["probs"] == pytest.approx(want["probs"], abs=1e-5)

        bad = {b'{"text": "the cat': 400, b'{"txt": "the cat"}': 422, b'[1, 2]': 422, b'{"text": 5}': 422,
               json.dumps({"text": "the cat sat on a mat " * 20}).encode(): 413}
        for body, code in bad.items():
            status, answer = post(port, body)
            assert status == code and set(answer) == {"error"} and "\n" not in answer["error"], (body, answer)
            assert "Traceback" not in answer["error"]
        assert "valid JSON" in post(port, b'{"text": "the cat')[1]["error"]
        assert "'text'" in post(port, b'{"txt": "the cat"}')[1]["error"]
        assert "max_length=32" in post(port, bad_long := json.dumps({"text": "a cat " * 40}).encode())[1]["error"]
        # a too-long text batched with good ones: only it is refused
        with ThreadPoolExecutor(max_workers=3) as pool:
            mixed = list(pool.map(lambda b: post(port, b), [json.dumps({"text": texts[0]}).encode(), bad_long,
                                                            json.dumps({"text": texts[1]}).encode()]))
        assert [status for status, _ in mixed] == [200, 413, 200]
        assert mixed[2][1]["label"] == expected[1]["label"]
        status, row = post(port, json.dumps({"text": texts[5]}).encode())  # still serving
        assert status == 200 and row["probs"] == pytest.approx(expected[5]["probs"], abs=1e-5)

        second = main_py("serve", "--ckpt_path", str(classifier_run), "--port", str(port))
        out, _ = second.communicate(timeout=120)
        lines = out.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1 and f"port {port} is in use" in lines[0], out
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the workers it started (its own session)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def test_the_embed_and_generate_tasks_answer_as_their_commands_in_a_batch(classifier_run, clm_run):
    """The worker side without HTTP: a batch of decoded requests gives what embed / generate give, and a request
    with bad decoding settings is refused alone (400) while the rest of its batch is answered."""
    import numpy as np

    from ptm_app.inference.embed import embed_texts
    from ptm_app.inference.generate import generate
    from ptm_app.inference.loading import load_for_inference
    from ptm_app.inference.serve import (PromptAPI, PromptRequest, Refused, ServeSettings, TextAPI, TextRequest,
                                         choose_task)

    texts = ["the cat sat on a mat", "markets rose as shares fell", "birds sang"]
    loaded = load_for_inference(str(classifier_run))
    assert choose_task(loaded, None) == ("predict", "text") and choose_task(loaded, "embed") == ("embed", "text")
    api = TextAPI(ServeSettings(str(classifier_run), "embed", "text"), max_batch_size=4)
    api.setup("cpu")
    rows = [api.encode_response(r) for r in api.predict([api.decode_request(TextRequest(text=t)) for t in texts])]
    np.testing.assert_allclose(np.array([r["embedding"] for r in rows]), embed_texts(loaded, texts), atol=1e-5)
    assert [r["text"] for r in rows] == texts

    assert choose_task(load_for_inference(str(clm_run)), None) == ("generate", "prompt")
    api = PromptAPI(ServeSettings(str(clm_run), "generate", "prompt"), max_batch_size=4)
    api.setup("cpu")
    requests = [PromptRequest(prompt="the cat", max_new_tokens=6), PromptRequest(prompt="dogs ran", temperature=0.5),
                PromptRequest(prompt="markets", max_new_tokens=6, do_sample=True, seed=3)]
    out = api.predict([api.decode_request(r) for r in requests])
    assert out[0] == {"prompt": "the cat", "generated": generate(str(clm_run), "the cat", 6, stream=False)}
    assert isinstance(out[1], Refused) and out[1].status == 400 and "--do_sample" in out[1].message
    assert out[2]["generated"] == generate(str(clm_run), "markets", 6, do_sample=True, seed=3, stream=False)
    response = api.encode_response(out[1])
    assert response.status_code == 400 and b'"error"' in response.body


@pytest.mark.slow  # ~25 s: two worker processes; the concurrent classifier test serves over HTTP in the default suite
def test_served_embeddings_over_http_with_two_workers_equal_the_embed_command(classifier_run):
    """The embed task through HTTP, with two worker processes answering concurrent requests: the vectors
    ``embed`` computes."""
    import numpy as np

    from ptm_app.inference.embed import embed_texts
    from ptm_app.inference.loading import load_for_inference

    texts = ["the cat sat on a mat", "markets rose as shares fell", "birds sang", "a dog ran", "rain fell", "no"]
    expected = embed_texts(load_for_inference(str(classifier_run)), texts)
    port = free_port()
    server = main_py("serve", "--ckpt_path", str(classifier_run), "--task", "embed", "--workers", "2",
                     "--port", str(port), "--max_batch_size", "2", "--batch_timeout", "0.05")
    try:
        wait_healthy(port, server)
        with ThreadPoolExecutor(max_workers=3) as pool:
            answers = list(pool.map(lambda t: post(port, json.dumps({"text": t}).encode()), texts))
        assert all(status == 200 for status, _ in answers), answers
        assert [row["text"] for _, row in answers] == texts
        np.testing.assert_allclose(np.array([row["embedding"] for _, row in answers]), expected, atol=1e-5)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def group_processes(pgid: int) -> list[int]:
    """Live (not zombie) processes of the process group ``pgid``, from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            pids.append(int(stat.parent.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads the process table from /proc")
def test_served_generator_caps_requests_answers_errors_as_one_line_and_sigterm_ends_every_process(clm_run):
    """Two workers: 50 concurrent requests all answered as ``generate`` answers them; a body over
    ``--max_request_bytes`` (declared or chunked) 413, a prompt + max_new_tokens beyond the model's 64 positions
    400 naming the limit, an empty prompt and an unknown path 4xx, each ``{"error": one line}``; then SIGTERM to the
    server process alone leaves no process of it alive and the port free."""
    from ptm_app.inference.generate import generate

    prompts = [f"the cat sat {i}" for i in range(50)]
    expected = {p: generate(str(clm_run), p, 3, stream=False) for p in prompts[:3]}
    port = free_port()
    server = main_py("serve", "--ckpt_path", str(clm_run), "--workers", "2", "--port", str(port),
                     "--max_batch_size", "8", "--max_request_bytes", "2000")
    try:
        wait_healthy(port, server)
        assert len(group_processes(server.pid)) >= 4  # the server, two inference workers, an API server (+ manager)
        body = lambda p: json.dumps({"prompt": p, "max_new_tokens": 3}).encode()  # noqa: E731
        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = list(pool.map(lambda p: post(port, body(p)), prompts))
        assert [status for status, _ in answers] == [200] * 50, [a for a in answers if a[0] != 200][:3]
        assert [row["prompt"] for _, row in answers] == prompts
        assert {p: answers[i][1]["generated"] for i, p in enumerate(prompts[:3])} == expected

        big = json.dumps({"prompt": "word " * 1000}).encode()  # 5 kB
        chunked = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=iter([big[:1500], big[1500:]]),
                                         method="POST", headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(chunked, timeout=60)
            raise AssertionError("a chunked body over the cap was accepted")
        except urllib.error.HTTPError as error:
            assert error.code == 413 and "2000 bytes" in json.loads(error.read())["error"]
        answers = {"big": post(port, big),
                   "long": post(port, json.dumps({"prompt": "the cat sat on a mat", "max_new_tokens": 200}).encode()),
                   "empty": post(port, json.dumps({"prompt": "", "max_new_tokens": 3}).encode())}
        for name, (status, answer) in answers.items():
            assert set(answer) == {"error"} and "\n" not in answer["error"], (name, answer)
        assert answers["big"][0] == 413 and "--max_request_bytes" in answers["big"][1]["error"]
        assert answers["long"][0] == 400 and "limit of 64" in answers["long"][1]["error"]
        assert answers["empty"][0] == 400 and "empty" in answers["empty"][1]["error"]
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=10)
        assert missing.value.code == 404 and set(json.loads(missing.value.read())) == {"error"}
        assert post(port, body("still serving"))[0] == 200

        server.send_signal(signal.SIGTERM)  # the server process only, as a supervisor stops it
        assert server.wait(timeout=60) == 0
        deadline = time.time() + 15
        while group_processes(server.pid) and time.time() < deadline:
            time.sleep(0.2)
        assert group_processes(server.pid) == []
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if group_processes(server.pid):
            os.killpg(server.pid, signal.SIGKILL)
        if server.poll() is None:
            server.kill()
            server.wait()
