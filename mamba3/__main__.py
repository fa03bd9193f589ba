"""Command line: ``python -m mamba3 info [--arch sm_89] [--json]``, ``python -m mamba3 check [--device cpu|cuda]``
and ``python -m mamba3 train {demo,parity,arith,arith_brackets,sweep,summarize} ...``.

info   versions, the device and its shared-memory opt-in limit, which backend runs for CPU / CUDA tensors, and
       per op the configuration the dispatcher would choose and the shared memory of every kernel it can
       launch (compiled ahead of time for ``--arch``, or for the current GPU: minutes from a cold Triton cache;
       ``--brief`` leaves the kernels out).
check  forward + backward of SISO and MIMO at a small shape through the public API (fp32, backend auto),
       compared with the recurrent definition evaluated in float64 on the same inputs; exit code 1 on failure.
train  the state-tracking tasks (mamba3.tasks.train; ``python -m mamba3 train --help``).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from dataclasses import asdict

from mamba3.dispatch import OPS, OPTIN_SMEM, arch_spec, device_spec, op_configs, parse_arch

# Bars for fp32 inputs against the float64 definition (relative Frobenius error).
BARS = {"output": 1e-5, "grad": 1e-4}


# ----------------------------------------------------------------------------------------------------- info

def _versions() -> dict:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    try:
        from mamba3 import __version__ as version
    except ImportError:
        version = None
    return {"mamba3": version, "torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version()}


def _target(spec, *, current: bool, compile_kernels: bool, spills: bool = False) -> dict:
    """What the dispatcher does on one device spec: chosen configs and (if asked) AOT-compiled kernels."""
    out = {"name": spec.name, "arch": spec.arch, "smem_optin": spec.smem_optin, "sm_count": spec.sm_count,
           "current_device": current, "ops": {}}
    for op in OPS:
        mod = op_configs(op)
        if mod is None:
            out["ops"][op] = {"status": "no Triton kernels yet"}
            continue
        entry = {"status": "ok", "chosen": mod.describe(spec)}
        if compile_kernels:
            if spec.arch not in OPTIN_SMEM:
                entry["kernels_note"] = f"sm_{spec.arch} is not a known architecture: not compiled"
            else:
                from mamba3.testing.aot import compile_launch

                kernels = []
                for launch in mod.aot_launches(spec.arch):
                    r = compile_launch(launch, spec.arch, spills=spills)
                    kernels.append({"name": r.name, "config": {k: v for k, v in launch.meta.items()},
                                    "shared": r.shared, "static_shared": r.static_shared,
                                    "total_shared": r.total_shared, "limit": spec.smem_optin,
                                    "fits": r.total_shared <= spec.smem_optin,
                                    "n_regs": r.n_regs, "n_spills": r.n_spills})
                entry["kernels"] = kernels
        out["ops"][op] = entry
    return out


def info(arch: int | None, as_json: bool, spills: bool = False, brief: bool = False) -> int:
    import torch

    data = {"versions": _versions()}
    cuda = torch.cuda.is_available()
    data["device"] = asdict(device_spec()) if cuda else None
    kernels_exist = {op: op_configs(op) is not None for op in OPS}
    data["backends"] = {
        "cpu": {op: "reference" for op in OPS},
        "cuda": {op: ("triton" if kernels_exist[op] else "reference (no Triton kernels yet)") for op in OPS},
    }
    targets = []
    if cuda:
        targets.append(_target(device_spec(), current=True, compile_kernels=not brief, spills=spills))
    if arch is not None:
        targets.append(_target(arch_spec(arch), current=False, compile_kernels=not brief, spills=spills))
    data["targets"] = targets

    if as_json:
        print(json.dumps(data, indent=2, default=str))
        return 0

    v = data["versions"]
    print(f"mamba3 {v['mamba3']} | torch {v['torch']} | triton {v['triton'] or 'not installed'} | "
          f"python {v['python']}")
    if data["device"] is None:
        print("device:  no CUDA device")
    else:
        d = data["device"]
        print(f"device:  {d['name']} (sm_{d['arch']}, {d['sm_count']} SMs), "
              f"shared memory opt-in {d['smem_optin']:,} B per block")
    for kind in ("cpu", "cuda"):
        per_op = ", ".join(f"{op}: {b}" for op, b in data["backends"][kind].items())
        print(f"backend for {kind.upper()} tensors: {per_op}")
    if not targets:
        print("(no GPU here: `python -m mamba3 info --arch sm_89` shows what would run on an RTX 4090, etc.; "
              f"known: {', '.join(f'sm_{a}' for a in sorted(OPTIN_SMEM))})")
    for t in targets:
        what = "this device" if t["current_device"] else "ahead of time, on this machine"
        print(f"\n{t['name']} ({what}; opt-in shared memory {t['smem_optin']:,} B)")
        for op, entry in t["ops"].items():
            if entry["status"] != "ok":
                print(f"  {op}: {entry['status']}")
                continue
            print(f"  {op}: chosen configurations")
            for row in entry["chosen"]:
                rest = {k: val for k, val in row.items() if k not in ("kernel", "config", "problem")}
                print(f"    {row.get('kernel')} [{row.get('problem')}]: {row.get('config')}"
                      + (f" {rest}" if rest else ""))
            if "kernels_note" in entry:
                print(f"    {entry['kernels_note']}")
            if "kernels" in entry:
                print(f"  {op}: every kernel the dispatcher can launch (compiled for sm_{t['arch']})")
                print(f"    {'kernel':<48} {'shared B':>9} {'static':>7} {'total':>9} {'fits':>5} "
                      f"{'regs':>5} {'spills':>6}")
                for k in entry["kernels"]:
                    print(f"    {k['name']:<48} {k['shared']:>9,} {k['static_shared']:>7,} {k['total_shared']:>9,} "
                          f"{'yes' if k['fits'] else 'NO':>5} {k['n_regs'] if k['n_regs'] is not None else '-':>5} "
                          f"{k['n_spills'] if k['n_spills'] is not None else '-':>6}")
    return 0


# ---------------------------------------------------------------------------------------------------- check

# Small, but inside every kernel's supported sizes (N, P ≥ 16), with GQA, D, Z and input states.
SHAPE = dict(bsz=2, seqlen=37, nheads=4, ngroups=2, dstate=16, headdim=16, nangles=4)
MIMO_RANK = 2
CHECK_OPS = ("siso", "mimo")  # the public operators `check` runs (not every entry of dispatch.OPS)


def _inputs(op: str, seed: int = 0):
    """Random fp32 CPU inputs (keyword arguments of the public function) and input states."""
    from mamba3.testing.inputs import mimo_inputs, siso_inputs

    if op == "siso":
        x = siso_inputs(**SHAPE, states=True, seed=seed)
    else:
        x = mimo_inputs(**SHAPE, rank=MIMO_RANK, states=True, seed=seed)
    return x, x.pop("input_states")


def _run(fn, x: dict, states: tuple, cotangents, dtype, device, **kwargs):
    """Forward + backward; returns (outputs dict, grads dict) as float64 CPU tensors."""
    import torch

    xs = {k: t.detach().to(device=device, dtype=dtype).requires_grad_(True) for k, t in x.items()}
    st = tuple(t.detach().to(device=device, dtype=dtype).requires_grad_(True) for t in states)
    out, final = fn(**xs, input_states=st, **kwargs)
    outs = {"out": out, "final angle": final[0], "final ssm": final[1], "final k": final[2], "final v": final[3]}
    loss = sum((o.double() * c.to(device)).sum() for o, c in zip(outs.values(), cotangents))
    leaves = {**{f"d{k}": t for k, t in xs.items()},
              **{f"d{n} state": t for n, t in zip(("angle", "ssm", "k", "v"), st)}}
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    as64 = lambda t: None if t is None else t.detach().to("cpu", torch.float64)  # noqa: E731
    return ({k: as64(t) for k, t in outs.items()}, {k: as64(g) for k, g in zip(leaves, grads)})


def _check_op(op: str, device) -> list[dict]:
    import torch

    import mamba3
    from mamba3 import reference
    from mamba3.testing import rel_frobenius

    x, states = _inputs(op, seed={"siso": 0, "mimo": 1}[op])
    api = mamba3.mamba3_siso if op == "siso" else mamba3.mamba3_mimo
    ref = reference.siso_recurrent if op == "siso" else reference.mimo_recurrent
    # cotangents for out and the four final states, shaped by a float64 reference forward
    with torch.no_grad():
        o64, f64 = ref(**{k: t.double() for k, t in x.items()}, input_states=tuple(t.double() for t in states))
    gen = torch.Generator().manual_seed(123)
    cot = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (o64, *f64)]

    try:
        got_o, got_g = _run(api, x, states, cot, torch.float32, device, return_final_states=True, backend="auto")
    except Exception as e:  # report, don't crash: the table says which op could not run and why
        return [{"op": op, "quantity": "forward+backward", "kind": "output", "error": math.inf,
                 "bar": BARS["output"], "pass": False, "message": f"{type(e).__name__}: {e}"}]
    ref_o, ref_g = _run(ref, x, states, cot, torch.float64, "cpu")
    rows = []
    for kind, got, want in (("output", got_o, ref_o), ("grad", got_g, ref_g)):
        for name in want:
            g, w = got[name], want[name]
            if g is None or w is None:
                err = 0.0 if (g is None and w is None) else math.inf
            else:
                if name == "final angle":  # angles live on a circle: compare the wrapped difference
                    g = w + torch.remainder(g - w + math.pi, 2 * math.pi) - math.pi
                err = rel_frobenius(g, w)
            rows.append({"op": op, "quantity": name, "kind": kind, "error": err, "bar": BARS[kind],
                         "pass": bool(err <= BARS[kind])})
    return rows


def check(device: str, as_json: bool) -> int:
    import torch

    from mamba3.dispatch import backend_for

    if device == "cuda" and not torch.cuda.is_available():
        print("check --device cuda: no CUDA device available", file=sys.stderr)
        return 2
    dev = torch.device(device)
    backend = backend_for(torch.empty(0, device=dev))
    rows = []
    for op in CHECK_OPS:
        rows += _check_op(op, dev)
    passed = all(r["pass"] for r in rows)
    if as_json:
        print(json.dumps({"device": str(dev), "dtype": "float32", "backend_auto": backend, "shape": SHAPE,
                          "reference": "recurrent, float64", "bars": BARS, "results": rows, "passed": passed},
                         indent=2))
    else:
        shape = " ".join(f"{k}={v}" for k, v in SHAPE.items())
        print(f"check: float32 on {dev} (backend auto -> {backend}) vs the recurrent definition in float64; {shape}")
        print(f"bars: output and final states {BARS['output']:.0e}, gradients {BARS['grad']:.0e} "
              "(relative Frobenius error)")
        print(f"{'op':<5} {'quantity':<16} {'rel. error':>11} {'bar':>7}  result")
        for r in rows:
            print(f"{r['op']:<5} {r['quantity']:<16} {r['error']:>11.2e} {r['bar']:>7.0e}  "
                  f"{'PASS' if r['pass'] else 'FAIL'}" + (f"  {r['message']}" if "message" in r else ""))
        n_fail = sum(not r["pass"] for r in rows)
        print("PASS: all checks" if passed else f"FAIL: {n_fail} of {len(rows)} checks above their bar")
    return 0 if passed else 1


# ------------------------------------------------------------------------------------------------------ main

def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from mamba3.tasks.train import main as train_main

        return train_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m mamba3", description="Mamba-3 SISO/MIMO layer: tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="versions, device, backends and kernel configurations")
    p_info.add_argument("--arch", help="answer for another architecture by compiling ahead of time "
                                       f"(e.g. sm_89; known: {', '.join(f'sm_{a}' for a in sorted(OPTIN_SMEM))})")
    p_info.add_argument("--json", action="store_true", help="machine-readable output")
    p_info.add_argument("--spills", action="store_true",
                        help="also count spill stores (one more ptxas run per kernel; slow for big kernels)")
    p_info.add_argument("--brief", action="store_true",
                        help="the chosen configurations without compiling every kernel (which takes minutes "
                             "from a cold Triton cache)")
    p_check = sub.add_parser("check", help="forward+backward of SISO and MIMO vs the float64 definition")
    p_check.add_argument("--device", choices=("cpu", "cuda"), default=None,
                         help="default: cuda if available, else cpu")
    p_check.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("train", help="state-tracking tasks: parity and modular arithmetic (see train --help)")
    args = parser.parse_args(argv)

    if args.command == "info":
        arch = None
        if args.arch is not None:
            try:
                arch = arch_spec(parse_arch(args.arch)).arch
            except ValueError as e:
                parser.error(str(e))
        return info(arch, args.json, args.spills, args.brief)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return check(device, args.json)


if __name__ == "__main__":
    sys.exit(main())
