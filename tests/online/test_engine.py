"""The rollout engine (`rollout.engine`): the choice and its reason, the one-line error without vLLM, when each
regime's sampler hands the policy's weights to an engine (with a stand-in engine that records its loads and samples
through the hf path, so it runs without vLLM), and the training-inference mismatch every sampled step logs. The
real engine's sync, proven by log-probs: tests/on_vllm/ (scripts/test_vllm.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers_reliability import assert_user_error, one_thread, online_config, online_sections, run_cli, write_recipe
from humanline.errors import UserError
from humanline.sampling import sampler as sampler_module
from humanline.sampling import vllm_engine
from humanline.sampling.rollout import HFGenerateBackend
from humanline.training.loop import Trainer

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.mark.parametrize("setting, device, installed, expected", [
    ("hf", "cuda", True, "hf"),
    ("auto", "cuda", True, "vllm"),
    ("auto", "cuda", False, "hf"),
    ("auto", "cpu", True, "hf"),
    ("vllm", "cpu", True, "vllm"),
])
def test_the_choice_and_its_reason(monkeypatch, setting, device, installed, expected):
    monkeypatch.setattr(vllm_engine, "vllm_installed", lambda: installed)
    engine, why = vllm_engine.choose_engine(setting, device, samples=True)
    assert engine == expected and why
    if setting == "auto" and not installed:
        assert "not installed" in why
    if setting == "auto" and device == "cpu" and installed:
        assert "BENCHMARKS.md" in why


def test_vllm_asked_for_and_missing_is_one_line_naming_the_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(vllm_engine, "vllm_installed", lambda: False)
    with pytest.raises(UserError, match=r"rollout.engine.*vllm is not installed; install it with pip install"):
        vllm_engine.choose_engine("vllm", "cpu", samples=True)
    recipe = write_recipe(tmp_path, online_sections(tmp_path / "run"), rollout={"engine": "vllm"})
    code, lines = run_cli(["train", recipe], capsys)
    line = assert_user_error(code, lines, "rollout.engine", "vllm is not installed", "scripts/setup.sh")
    assert len(line) <= 300
    assert not (tmp_path / "run").exists()  # refused before the run folder was made


class RecordingEngine:
    """A stand-in for `VLLMEngine`: records each load (the version asked for, whether it copied) and samples
    with the hf path from the model it was last given."""

    loads: list[tuple[object, bool]] = []

    def __init__(self, **settings):
        self.llm, self.version, self.start_seconds, self.model = None, None, 0.0, None

    def load(self, model, tokenizer, version) -> bool:
        self.llm = True
        copied = version is None or version != self.version
        self.version, self.model = version, model
        RecordingEngine.loads.append((version, copied))
        return copied

    def generate(self, model, tokenizer, prompt_token_ids, cfg):
        return HFGenerateBackend().generate(self.model, tokenizer, prompt_token_ids, cfg)

    def close(self):
        pass


@pytest.fixture
def recording(monkeypatch):
    monkeypatch.setattr(vllm_engine, "vllm_installed", lambda: True)
    monkeypatch.setattr(sampler_module, "VLLMEngine", RecordingEngine)
    RecordingEngine.loads = []
    return RecordingEngine


@pytest.mark.parametrize("train, copies", [
    ({"regime": "online"}, [0, 1, 2, 3, 4, 5, 6, 7]),
    ({"regime": "sparse", "sample_every": 4}, [0, 4]),
    ({"regime": "sparse", "sample_every": 3, "reference": "sampler"}, [0, 3, 6]),  # rounds3
    ({"regime": "stale", "staleness": 2}, [0, 1, 2, 3, 4, 5]),  # the last two steps sample nothing (past the end)
])
def test_the_engine_gets_the_weights_exactly_when_the_regime_samples(tmp_path, recording, train, copies):
    """The weights go in once per sampling step, the version being the step whose policy samples; redraws at the
    same step (rollout.redraws) sample from the weights already there."""
    cfg = online_config(tmp_path / "run", 8, train=train, rollout={"engine": "vllm", "redraws": 2})
    trainer = Trainer(cfg)
    rows = [trainer.train_step() for _ in range(8)]
    trainer.close_sampler()
    assert [v for v, copied in recording.loads if copied] == copies
    assert all(v in copies for v, _ in recording.loads)  # every other load asked for a version already held
    synced = [s for s, r in enumerate(rows) if r.get("engine/synced")]
    assert synced == copies


def test_the_first_lines_say_which_engine_and_why(tmp_path, capsys):
    Trainer(online_config(tmp_path / "run", 1)).train()
    out = capsys.readouterr()
    assert "rollout engine: hf (auto: " in out.out + out.err


@pytest.mark.parametrize("rollout, bound", [({}, (0.0, 1e-5)), ({"dtype": "bfloat16"}, (1e-5, 0.1)),
                                            ({"temperature": 0.7}, (1e-3, 1.0))])
def test_every_sampled_step_logs_the_mismatch(tmp_path, rollout, bound):
    """`mismatch/mean` and `mismatch/max` over the sampled tokens: rounding alone for the policy's own weights at
    temperature 1; the bf16 copy's rounding; the temperature's reshaping (logged, as the corrections see it)."""
    cfg = online_config(tmp_path / "run", 3, model={"tiny_hidden_size": 32}, rollout={"max_new_tokens": 12,
                                                                                      **rollout})
    Trainer(cfg).train()
    rows = [json.loads(line) for line in Path(cfg.train.output_dir, "metrics.jsonl").read_text().splitlines()]
    sampled = [r for r in rows if "samples" in r]
    assert len(sampled) == 3
    for r in sampled:
        assert r["mismatch/tokens"] > 0 and r["mismatch/mean"] <= r["mismatch/max"]
        assert bound[0] <= r["mismatch/mean"] < bound[1], (rollout, r["mismatch/mean"])
