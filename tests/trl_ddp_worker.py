"""Worker for test_integrations_trl.py's DDP test: TRL DPO + make_humanline on the tiny model, under torchrun.

    python -m torch.distributed.run --nproc_per_node=N tests/trl_ddp_worker.py OUT GLOBAL_BATCH

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

    from humanline.tiny import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    model = make_model(tokenizer)
    args = DPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=global_batch // world, max_steps=3,
                     learning_rate=H.LR, lr_scheduler_type="constant", report_to=[], save_strategy="no",
                     logging_steps=1, disable_tqdm=True, use_cpu=True, gradient_checkpointing=False, bf16=False,
                     seed=0, train_sampling_strategy="sequential", ddp_backend="gloo")
    trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, processing_class=tokenizer,
                         train_dataset=Dataset.from_list(H.records("dpo", 32)))
    init = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    make_humanline(trainer, HumanlineArgs(sync_every=1, low=H.BAND[0], high=H.BAND[1]))
    trainer.train()
    if trainer.accelerator.is_main_process:
        torch.save({n: p.detach().cpu() for n, p in trainer.model.named_parameters()}, out / "final.pt")
        torch.save(init, out / "init.pt")
        (out / "log.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main()
