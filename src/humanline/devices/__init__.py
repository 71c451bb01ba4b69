"""Where a run executes: sums and means across processes (`collectives`), FSDP2 and DeepSpeed ZeRO as the
loop meets them (`fsdp`, `zero`), and allocation failures turned into one line (`out_of_memory`).
"""
