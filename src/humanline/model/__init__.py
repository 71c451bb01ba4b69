"""The policy as a model: loading it (`loading`: hub names, folders, GGUF files, LoRA; `tiny`: the local
test model), and the forward passes that turn a collated batch into per-token log-probs (`forward`,
over the shared-prompt layout `prefix` and the fused scoring head `head`).
"""
