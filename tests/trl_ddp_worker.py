"""Worker for test_integrations_trl.py's DDP and FSDP2 tests: TRL DPO + make_humanline on the tiny model.

    python -m torch.distributed.run --nproc_per_node=N tests/trl_ddp_worker.py OUT GLOBAL_BATCH [grpo]
    accelerate launch --config_file recipes/accelerate/fsdp.yaml --num_processes 2 tests/trl_ddp_worker.py OUT 4

`grpo`: TRL's GRPO instead (4 completions of 6 tokens per prompt, sampled by TRL, scored by the share of
digits, beta 0), GLOBAL_BATCH completions per step.

Under the FSDP config (ACCELERATE_USE_FSDP=true) the CPU process group is switched to accelerate's FSDP2 path
first (`humanline.devices.fsdp.enable_on_cpu`, float32), and TRL is told to use that accelerate state
(`accelerator_config.use_configured_state`): transformers would otherwise set up accelerate anew, for DDP.

Every process builds the same tiny model (seeded) and TRL trainer with a per-device batch of GLOBAL_BATCH / N,
so one process and N processes train on the same global batches; rank 0 writes OUT/init.pt and OUT/final.pt
(the policy's weights before and after) and OUT/log.json (TRL's log history).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers_trl as H  # noqa: E402
from humanline.integrations.trl import HumanlineArgs, make_humanline  # noqa: E402


def main() -> None:
    out, global_batch = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from humanline.model.tiny import make_model, make_tokenizer

    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false") == "true"
    if fsdp:
        from accelerate import Accelerator

        from humanline.devices.fsdp import enable_on_cpu

        assert enable_on_cpu(Accelerator(cpu=True, mixed_precision="no"))
    tokenizer = make_tokenizer()
    model = make_model(tokenizer)
    common = dict(output_dir=str(out / "trl"), per_device_train_batch_size=global_batch // world, max_steps=3,
                  learning_rate=H.LR, lr_scheduler_type="constant", report_to=[], save_strategy="no",
                  logging_steps=1, disable_tqdm=True, use_cpu=True, gradient_checkpointing=False, bf16=False,
                  seed=0, train_sampling_strategy="sequential", ddp_backend="gloo",
                  accelerator_config={"use_configured_state": fsdp})
    if len(sys.argv) > 3 and sys.argv[3] == "grpo":
        trainer = _grpo(model, tokenizer, common)
    else:
        args = DPOConfig(**common)
        trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, processing_class=tokenizer,
                             train_dataset=Dataset.from_list(H.records("dpo", 32)))
    init = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    make_humanline(trainer, HumanlineArgs(sync_every=1, low=H.BAND[0], high=H.BAND[1]))
    trainer.train()
    final = {n: p.detach() for n, p in trainer.model.named_parameters()}
    final = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).cpu() for n, p in final.items()}  # FSDP: whole
    (out / f"distributed_{int(os.environ.get('RANK', '0'))}.txt").write_text(str(trainer.accelerator.distributed_type))
    if trainer.accelerator.is_main_process:
        torch.save(final, out / "final.pt")
        torch.save(init, out / "init.pt")
        (out / "log.json").write_text(json.dumps(trainer.state.log_history))


def _grpo(model, tokenizer, common: dict):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def digits(completions, **_):  # share of digit characters: a random tiny model gets varied scores
        texts = [completion[-1]["content"] for completion in completions]
        return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in texts]

    # beta = 0: TRL keeps no reference model, so humanline copies the policy (sharded, under FSDP2)
    args = GRPOConfig(**common, num_generations=4, max_completion_length=6, beta=0.0, epsilon=0.2)
    return GRPOTrainer(model=model, reward_funcs=digits, args=args, processing_class=tokenizer,
                       train_dataset=Dataset.from_list(H.records("grpo", 32)))


if __name__ == "__main__":
    main()
