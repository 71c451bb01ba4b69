"""token_logps (the one place that shifts labels) and the masked reductions."""

from __future__ import annotations

import math

import pytest
import torch

import humanline.core.logps as logps_module
import reference_impl as ref
from humanline import masked_mean, masked_sum, sequence_logps, token_logps


def _random_case(seed: int, n_seq: int = 3, length: int = 7, vocab: int = 11, scale: float = 3.0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n_seq, length, vocab, generator=gen) * scale
    labels = torch.randint(0, vocab, (n_seq, length), generator=gen)
    mask = torch.rand(n_seq, length, generator=gen) < 0.7
    return logits, labels, mask


def test_label_shift_hand_computed():
    """Position t predicts labels[t + 1]. Input ids [0, 2, 3], vocabulary 4, all completion tokens.
    logits[0] = log [0.1, 0.2, 0.3, 0.4] -> log p(label 2) = log 0.3 = -1.20397;
    logits[1] = log [0.25, 0.25, 0.25, 0.25] + 7 (a shift does not change the softmax) -> log 0.25 = -1.38629.
    logits[2] predicts nothing (no label after it) and is dropped. Without the shift we would read
    log 0.1 and log 0.25 at labels 0 and 2."""
    logits = torch.stack(
        [
            torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4])),
            torch.full((4,), math.log(0.25) + 7.0),
            torch.tensor([100.0, -100.0, 0.0, 0.0]),
        ]
    )[None]
    labels = torch.tensor([[0, 2, 3]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    out, out_mask = token_logps(logits, labels, mask)
    assert out.shape == (1, 2) and out_mask.tolist() == [[True, True]]
    assert out[0, 0].item() == pytest.approx(math.log(0.3), abs=1e-6)
    assert out[0, 1].item() == pytest.approx(math.log(0.25), abs=1e-6)


def test_shifted_mask_and_masked_positions_are_zero():
    logits, labels, mask = _random_case(0)
    out, out_mask = token_logps(logits, labels, mask)
    assert torch.equal(out_mask, mask[:, 1:])
    assert (out[~out_mask] == 0.0).all()
    assert (out[out_mask] < 0.0).all()


def test_fp32_matches_naive_reference():
    for seed in range(3):
        logits, labels, mask = _random_case(seed, n_seq=2 + seed, length=5 + 2 * seed, vocab=13)
        out, _ = token_logps(logits, labels, mask)
        torch.testing.assert_close(out.double(), ref.token_logps(logits, labels, mask), rtol=1e-5, atol=1e-5)


def test_bf16_close_to_reference_with_large_logits():
    """Logits of magnitude ~40 in bf16: the reference works in float64 on the same bf16-rounded values.
    A softmax evaluated in bf16 would be off by ~0.1-0.3 here (bf16 spacing at 40 is 0.25), so the 2e-3
    tolerance checks that the helper computes in float32 rather than merely 'works'."""
    logits, labels, mask = _random_case(1, vocab=257, scale=40.0)
    logits_bf16 = logits.to(torch.bfloat16)
    out, _ = token_logps(logits_bf16, labels, mask)
    assert torch.isfinite(out).all()
    expected = ref.token_logps(logits_bf16.double(), labels, mask)
    torch.testing.assert_close(out.double(), expected, rtol=0.0, atol=2e-3)


def test_labels_minus_100_at_masked_positions():
    """Padding labels of -100 (the HF convention) at masked positions must not reach `gather`."""
    logits, labels, mask = _random_case(2)
    labels_pad = labels.masked_fill(~mask, -100)
    out_pad, _ = token_logps(logits, labels_pad, mask)
    out, _ = token_logps(logits, labels, mask)
    assert torch.equal(out_pad, out)


def test_gradient_parity_with_naive_version():
    logits, labels, mask = _random_case(3)
    weights = torch.randn(3, 6, generator=torch.Generator().manual_seed(9))
    x = logits.clone().requires_grad_()
    out, _ = token_logps(x, labels, mask)
    (out * weights).sum().backward()
    x64 = logits.double().requires_grad_()
    (ref.token_logps(x64, labels, mask) * weights.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)
    # Masked positions (and the last position, which predicts nothing) get no gradient at all.
    assert (x.grad[:, -1] == 0).all()
    assert (x.grad[:, :-1][~mask[:, 1:]] == 0).all()


def test_chunked_path_matches_unchunked(monkeypatch):
    """More rows than one chunk: the chunk boundary must not shift or drop anything."""
    logits, labels, mask = _random_case(4, n_seq=2, length=12, vocab=9)
    full, _ = token_logps(logits, labels, mask)
    monkeypatch.setattr(logps_module, "_CHUNK_ROWS", 5)
    chunked, _ = token_logps(logits, labels, mask)
    assert torch.equal(full, chunked)


def test_shape_errors():
    with pytest.raises(ValueError):
        token_logps(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError):
        token_logps(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool))


def test_masked_reductions_ignore_inf_and_nan():
    """Row 0: 1 + 2 = 3 over 2 tokens (mean 1.5); row 1 has no masked token: sum 0, mean 0. Total 3 / 2."""
    values = torch.tensor([[1.0, float("nan"), 2.0], [float("inf"), -float("inf"), float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]], dtype=torch.bool)
    assert masked_sum(values, mask, dim=-1).tolist() == [3.0, 0.0]
    assert masked_mean(values, mask, dim=-1).tolist() == [1.5, 0.0]
    assert masked_sum(values, mask).item() == 3.0
    assert masked_mean(values, mask).item() == 1.5
    assert sequence_logps(values, mask).tolist() == [3.0, 0.0]
    masked_mean(values, mask).backward()
    assert values.grad.tolist() == [[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]]


def test_nonfinite_logits_at_masked_positions_are_inert():
    logits, labels, mask = _random_case(5)
    mask[0, 3] = False  # position 2 predicts the masked token 3
    clean = logits.clone().requires_grad_()
    token_logps(clean, labels, mask)[0].sum().backward()
    dirty = logits.clone()
    dirty[0, 2] = float("nan")
    dirty.requires_grad_()
    out, _ = token_logps(dirty, labels, mask)
    out.sum().backward()
    assert torch.equal(out, token_logps(logits, labels, mask)[0])
    assert torch.equal(dirty.grad, clean.grad)


# ---------------------------------------------------------------- linear_logps (fused projection + log-softmax)


def _linear_case(seed: int, n: int = 9, hidden: int = 6, vocab: int = 13, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=gen, dtype=dtype)
    w = torch.randn(vocab, hidden, generator=gen, dtype=dtype)
    b = torch.randn(vocab, generator=gen, dtype=dtype)
    targets = torch.randint(0, vocab, (n,), generator=gen)
    return h, w, b, targets


def test_linear_logps_hand_computed():
    """One row, hidden [1, 0], weight rows [0, 0], [1, 0], [0, 1] -> logits [0, 1, 0]; target 1:
    log p = 1 - log(1 + e + 1) = 1 - log(2 + e) = -0.551445."""
    h = torch.tensor([[1.0, 0.0]], requires_grad=True)
    w = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    out = logps_module.linear_logps(h, w, torch.tensor([1]))
    assert out.item() == pytest.approx(1 - math.log(2 + math.e), abs=1e-6)
    out.sum().backward()
    # d/dz = onehot - softmax = [-1, e - ... ] -> grad_h = (onehot - p) @ W; p = [1, e, 1] / (2 + e)
    p = torch.tensor([1.0, math.e, 1.0]) / (2 + math.e)
    torch.testing.assert_close(h.grad[0], (torch.tensor([0.0, 1.0, 0.0]) - p) @ w.detach())


def test_linear_logps_values_and_gradients_match_the_plain_computation(monkeypatch):
    """Against the full (n, V) log-softmax in float64, chunked at 4 rows (3 chunks: 4, 4, 1): values,
    and the gradients of hidden, weight and bias by autograd (gradcheck, finite differences)."""
    monkeypatch.setattr(logps_module, "_CHUNK_BYTES", 4 * 4 * 13)
    h, w, b, targets = (t.requires_grad_() if t.is_floating_point() else t for t in _linear_case(0))
    plain = (h @ w.T + b).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(logps_module.linear_logps(h, w, targets, b), plain, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda h, w, b: logps_module.linear_logps(h, w, targets, b), (h, w, b))


def test_linear_logps_bf16_matches_upcast_logits_and_accumulates_weight_grads_in_float32():
    h, w, _, targets = _linear_case(1, n=64, vocab=50, dtype=torch.bfloat16)
    h.requires_grad_(), w.requires_grad_()
    weights = torch.randn(64, generator=torch.Generator().manual_seed(2))
    out = logps_module.linear_logps(h, w, targets)
    assert out.dtype == torch.float32
    (out * weights).sum().backward()
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    exact = (h64 @ w64.T).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    (exact * weights.double()).sum().backward()
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=0.05)  # bf16 logits: ~3 significant digits
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=0.02, atol=0.02 * float(w64.grad.abs().max()))
    torch.testing.assert_close(h.grad.double(), h64.grad, rtol=0.02, atol=0.02 * float(h64.grad.abs().max()))


def test_linear_logps_saves_no_vocabulary_sized_tensor_for_backward():
    """The point of the fusion: what autograd keeps is hidden, weight (a parameter), targets and one
    logsumexp per row, never (n, V). 100 rows x vocabulary 5,000: (n, V) float32 would be 2 MB."""
    h, w, _, targets = _linear_case(3, n=100, hidden=8, vocab=5000, dtype=torch.float32)
    h.requires_grad_(), w.requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logps_module.linear_logps(h, w, targets)
    assert saved and max(t.numel() for t in saved) == w.numel()  # the weight itself, nothing bigger
    assert all(t.numel() < 100 * 5000 for t in saved)


def test_linear_logps_shape_errors():
    with pytest.raises(ValueError, match="linear_logps"):
        logps_module.linear_logps(torch.zeros(2, 3), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long))


def test_linear_logps_in_vocabulary_slices_bf16_matches_one_slice(monkeypatch):
    """bf16, the vocabulary cut into slices of 7 columns (8 slices of 50): the per-slice logsumexps combine in
    float32 to the one-slice result (last bits), and so do the gradients."""
    h, w, _, targets = _linear_case(4, n=16, vocab=50, dtype=torch.bfloat16)
    weights = torch.randn(16, generator=torch.Generator().manual_seed(5))

    def run():
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        out = logps_module.linear_logps(hh, ww, targets)
        (out * weights).sum().backward()
        return out.detach(), hh.grad.float(), ww.grad.float()

    whole = run()
    monkeypatch.setattr(logps_module, "_CHUNK_BYTES", 4 * 16 * 7)
    sliced = run()
    torch.testing.assert_close(sliced[0], whole[0], rtol=0, atol=1e-5)
    for a, b in zip(sliced[1:], whole[1:]):  # bf16 gradients: one rounding apart at most
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2 * float(b.abs().max()))


def test_linear_logps_backward_makes_no_vocabulary_by_hidden_temporary(monkeypatch):
    """The weight's gradient is written slice by slice into its one (V, H) buffer: no other tensor of that
    size is made in the backward (a per-chunk `g.T @ h` followed by an add would make one per chunk)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    h, w, _, targets = _linear_case(6, n=40, hidden=8, vocab=300, dtype=torch.float32)
    monkeypatch.setattr(logps_module, "_CHUNK_BYTES", 4 * 40 * 16)  # 19 slices of 16 columns
    h.requires_grad_(), w.requires_grad_()
    out = logps_module.linear_logps(h, w, targets)

    class Sizes(TorchDispatchMode):
        large = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            outputs = result if isinstance(result, (tuple, list)) else [result]
            self.large += sum(isinstance(t, torch.Tensor) and t.shape == w.shape for t in outputs)
            return result

    with Sizes() as sizes:
        out.sum().backward()
    assert sizes.large <= 2  # the (V, H) gradient buffer, and autograd's accumulation into .grad


def test_compiled_forms_of_the_slice_math_equal_the_eager_ones():
    """`train.compile` compiles the plain forms; the eager forms work in place. Same numbers."""
    gen = torch.Generator().manual_seed(7)
    z = torch.randn(6, 11, generator=gen, dtype=torch.float64) * 4
    idx, inside = torch.tensor([0, 3, 10, 5, 2, 7]), torch.tensor([True, False, True, True, False, True])
    for a, b in zip(logps_module._slice_stats_eager(z, idx, inside, torch.float64),
                    logps_module._slice_stats_plain(z, idx, inside, torch.float64)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    lse, go = torch.logsumexp(z, -1), torch.randn(6, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(logps_module._slice_grad_eager(z, lse, go, idx, inside),
                               logps_module._slice_grad_plain(z, lse, go, idx, inside), rtol=0, atol=1e-12)


@pytest.mark.slow
def test_compiled_head_matches_the_eager_head():
    """`torch.compile` of the slice math (inductor, a C++ compiler on the CPU: tens of seconds)."""
    h, w, b, targets = _linear_case(8, n=20, hidden=8, vocab=40, dtype=torch.float32)
    results = []
    for compiled in (False, True):
        hh, ww, bb = (t.clone().requires_grad_() for t in (h, w, b))
        out = logps_module.linear_logps(hh, ww, targets, bb, compiled=compiled)
        out.sum().backward()
        results.append((out.detach(), hh.grad, ww.grad, bb.grad))
    for a, c in zip(*results):
        torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-5)
