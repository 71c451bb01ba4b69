"""Bridges to other training stacks. Nothing is imported here eagerly: each bridge needs its own extra.

- `humanline.integrations.trl`: make TRL's `DPOTrainer`, `KTOTrainer` and `GRPOTrainer` humanline
  (`make_humanline(trainer, HumanlineArgs(...))`; extra `[trl]`; docs/trl.md).
"""
