"""Where a profiled step's time went, read from a torch.profiler (Kineto) chrome trace: pure functions.

The trace holds host events (`cpu_op`, `user_annotation`: the `record_function` labels the profiling script
puts around each step and each of its phases, `cuda_runtime`: kernel launches, synchronisations) and device
events (`kernel`, `gpu_memcpy`, `gpu_memset`) on one clock; a launch and its kernel share `args.correlation`.

    stats = step_stats(json.load(open(path))["traceEvents"], step="profiled_step", phases=PHASES)
"""

from __future__ import annotations

import bisect
import re

DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
            "cudaLaunchCooperativeKernel", "hipLaunchKernel", "hipExtModuleLaunchKernel"}
GAP_US = 5.0  # a device gap shorter than this is the normal spacing of back-to-back kernels, not idling
GROUPS = [  # first match wins; "head" is decided by the launch's annotation before these (see `kernel_group`)
    ("GEMM", re.compile(r"gemm|gemv|cutlass|cublas|nvjet|xmma|wgmma|matmul|_mm_|splitk", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|efficient", re.I)),
    ("optimizer", re.compile(r"adam|optimizer", re.I)),
    ("head", re.compile(r"log_?prob|lm_head|cross_entropy|fused_linear", re.I)),
]


def _x(events: list[dict], cats) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in cats]


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of `(start, end)` intervals, sorted and non-overlapping."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def clip(intervals, windows) -> list[tuple[float, float]]:
    """The parts of `intervals` inside the union of `windows`."""
    out = []
    for a, b in intervals:
        for lo, hi in windows:
            if min(b, hi) > max(a, lo):
                out.append((max(a, lo), min(b, hi)))
    return out


class Labels:
    """The innermost `record_function` label of a thread at a time (annotations nest)."""

    def __init__(self, annotations: list[dict], names: set[str]):
        self.by_tid: dict = {}
        for e in annotations:
            if e["name"] in names:
                self.by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        for spans in self.by_tid.values():
            spans.sort()
        self.starts = {tid: [s for s, _, _ in spans] for tid, spans in self.by_tid.items()}

    def at(self, tid, ts: float) -> str | None:
        spans = self.by_tid.get(tid, [])
        best = None
        for i in range(bisect.bisect_right(self.starts.get(tid, []), ts) - 1, -1, -1):
            start, end, name = spans[i]
            if start <= ts <= end and (best is None or start >= best[0]):
                best = (start, name)
        return best[1] if best else None


def kernel_group(name: str, in_head: bool) -> str:
    """GEMMs by name first (a matmul is a matmul wherever it runs); then what our head's annotation covers;
    then by name; the rest is elementwise work (pointwise, reductions, copies, indexing)."""
    if GROUPS[0][1].search(name):
        return "GEMM"
    if in_head:
        return "head"
    for group, pattern in GROUPS[1:]:
        if pattern.search(name):
            return group
    return "elementwise"


def step_stats(events: list[dict], *, step: str, phases: set[str], head: str = "head") -> dict:
    """Per profiled step: wall, device busy share, kernel launches, CUDA synchronisations, host time by phase,
    device idle gaps by the phase that launched the kernel ending the gap, and device time by kernel group.

    Phase of a launch: the innermost phase label on the thread that ran the steps (the autograd engine's
    threads carry none of their own: their launches count for the phase the step's thread is in then)."""
    annotations = _x(events, ("user_annotation",))
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in annotations if e["name"] == step]
    if not steps:
        raise ValueError(f"no '{step}' annotation in the trace")
    main_tid = next(e["tid"] for e in annotations if e["name"] == step)
    wall = sum(b - a for a, b in steps)
    labels, heads = Labels(annotations, phases), Labels(annotations, {head})
    runtime = [e for e in _x(events, ("cuda_runtime", "cuda_driver")) if any(lo <= e["ts"] <= hi for lo, hi in steps)]
    launch_of = {e.get("args", {}).get("correlation"): e for e in runtime if e["name"] in LAUNCHES}
    device = [e for e in _x(events, DEVICE) if clip([(e["ts"], e["ts"] + e["dur"])], steps)]
    busy = merge(clip([(e["ts"], e["ts"] + e["dur"]) for e in device], steps))
    host_phase: dict[str, float] = {}
    for e in annotations:
        if e["name"] in phases and e["tid"] == main_tid:
            host_phase[e["name"]] = host_phase.get(e["name"], 0.0) + e["dur"]
    groups: dict[str, float] = {}
    for e in device:
        launch = launch_of.get(e.get("args", {}).get("correlation"))
        in_head = launch is not None and heads.at(launch["tid"], launch["ts"]) == head
        group = kernel_group(e["name"], in_head) if e["cat"] == "kernel" else "elementwise"
        groups[group] = groups.get(group, 0.0) + e["dur"]
    n = len(steps)
    return {
        "steps": n,
        "wall_ms_per_step": wall / n / 1e3,
        "device_busy_share": sum(b - a for a, b in busy) / wall if device else None,
        "kernel_launches_per_step": sum(e["name"] in LAUNCHES for e in runtime) / n if device else None,
        "cuda_syncs_per_step": sum("Synchronize" in e["name"] or e["name"] == "cudaMemcpy" for e in runtime) / n,
        "host_ms_per_step_by_phase": {k: v / n / 1e3 for k, v in sorted(host_phase.items())},
        "idle_ms_per_step_by_phase": _gaps(busy, steps, device, launch_of, labels, main_tid, n) if device else None,
        "device_ms_per_step_by_group": {k: v / n / 1e3 for k, v in sorted(groups.items())} if device else None,
        "aten_ops_per_step": sum(1 for e in _x(events, ("cpu_op",)) if any(lo <= e["ts"] <= hi for lo, hi in steps))
        / n,
    }


def _gaps(busy, steps, device, launch_of, labels, main_tid, n) -> dict:
    """Device idle time inside the steps, each gap (>= GAP_US) charged to the phase that launched the work
    ending it (the host was busy there instead of feeding the device); the tail after the last kernel of a step
    is charged to "after last kernel"."""
    first_at = {}  # interval start -> the phase of the earliest device event starting there
    for e in sorted(device, key=lambda e: e["ts"]):
        launch = launch_of.get(e.get("args", {}).get("correlation"))
        first_at.setdefault(e["ts"], labels.at(main_tid, launch["ts"]) if launch else None)
    out: dict[str, float] = {}
    for lo, hi in steps:
        inside = [(a, b) for a, b in busy if a < hi and b > lo]
        edges = [lo] + [b for _, b in inside]
        for (a, _), prev_end in zip(inside, edges):
            if a - prev_end >= GAP_US:
                phase = first_at.get(a) or "other"
                out[phase] = out.get(phase, 0.0) + a - prev_end
        tail = hi - (inside[-1][1] if inside else lo)
        if tail >= GAP_US:
            out["after last kernel"] = out.get("after last kernel", 0.0) + tail
    return {k: v / n / 1e3 for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
