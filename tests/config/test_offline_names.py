"""Offline means offline: a model or dataset name that is neither built in, a local path, nor in the local Hugging
Face cache fails in one line within a second when the hub cannot be reached (HF_HUB_OFFLINE, or no network),
naming what was looked for; it used to cost 29-55 s of hub retries and 11-22 lines of noise."""

from __future__ import annotations

import time

import pytest

from helpers_reliability import DATA, assert_user_error, run_cli
from humanline import hub

NO_NETWORK = {"offline-env": (True, None), "no-answer": (False, "http://127.0.0.1:9")}  # port 9: refused at once
CASES = {
    "eval-model": (["eval", "owner/typo-model", "--prompts", DATA / "eval_prompts.jsonl"], "model 'owner/typo-model'"),
    "eval-one-word": (["eval", "typo-model", "--prompts", DATA / "eval_prompts.jsonl"], "model 'typo-model'"),
    "inspect-model": (["inspect", "data", DATA / "pairs.jsonl", "--model", "owner/typo"], "model 'owner/typo'"),
    "data-check-dataset": (["data", "check", "owner/typo-data"], "owner/typo-data: not a local file or folder"),
    "tokenizer": (["data", "check", DATA / "pairs.jsonl", "--tokenizer", "owner/typo"], "model 'owner/typo'"),
}


@pytest.fixture(params=list(NO_NETWORK))
def no_network(request, monkeypatch):
    from huggingface_hub import constants

    offline, endpoint = NO_NETWORK[request.param]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint or constants.ENDPOINT)
    monkeypatch.setattr(hub, "_reachable", {})
    for name in ("AutoTokenizer", "AutoModelForCausalLM"):  # the hub path is never taken
        import transformers

        monkeypatch.setattr(getattr(transformers, name), "from_pretrained",
                            lambda *a, **k: pytest.fail("from_pretrained was called"))
    return request.param


@pytest.mark.parametrize("case", list(CASES))
def test_an_unknown_name_fails_in_one_line_within_a_second(no_network, case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv, needle = CASES[case]
    start = time.perf_counter()
    code, lines = run_cli(argv, capsys)
    elapsed = time.perf_counter() - start
    why = "HF_HUB_OFFLINE is set" if no_network == "offline-env" else "no answer from it within 1 s"
    line = assert_user_error(code, lines, needle, "local Hugging Face cache" if "model" in needle else "local cache",
                             why)
    assert elapsed < 1.5, f"{elapsed:.1f} s"
    assert len(line) <= 300 and list(tmp_path.iterdir()) == []


def test_a_cached_name_is_read_from_the_cache_alone_when_the_hub_cannot_be_reached(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert not hub.cached("owner/model")
    (tmp_path / "models--owner--model" / "snapshots" / "abc123").mkdir(parents=True)
    (tmp_path / "datasets--owner--data" / "snapshots" / "abc123").mkdir(parents=True)
    assert hub.cached("owner/model") and hub.cached("owner/data", "dataset") and not hub.cached("owner/data")
    assert hub.local_only("owner/model") == {"local_files_only": True}
    assert hub.local_only(str(tmp_path)) == {}  # a local folder is no hub name


def test_the_probe_gives_up_within_its_time(monkeypatch):
    """A name lookup that hangs (a broken resolver) cannot hold the command: the probe runs in a thread."""
    import socket

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_reachable", {})
    def hang(*args, **kwargs):
        time.sleep(3)
        raise OSError("timed out")

    monkeypatch.setattr(socket, "create_connection", hang)
    start = time.perf_counter()
    assert not hub.reachable()
    assert time.perf_counter() - start < hub.PROBE_SECONDS + 0.5
