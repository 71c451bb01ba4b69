"""Completions and their rewards: the generation backend (`rollout`, over the CPU decode loop `decode`),
reward functions (`rewards`) called safely (`reward_scoring`), and the training loop's online and
sparse sampler (`sampler`).
"""
