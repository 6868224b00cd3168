"""Whether the library's direct kernel launches (``kernels/_launch.py``) give Triton's own results,
bit for bit, on a CUDA device.

Every loss family that launches kernels (AUC, LaA and LoA on the layout kernels, with and without
groups; the dense kernels at 2,000 items; PDAOM's max-violation pairs), one forward + backward each: three calls
through the direct launches (the first launch of each key goes through Triton, the later ones do
not), then three with every launch through Triton's path (``_launch.DIRECT = False``, what
``MLLOSS_TRITON_LAUNCH=triton`` sets at import). The losses and gradients must be equal bit for
bit. Exit status 3 (``DIFFER_STATUS``) and one line per difference otherwise: ``gpu_session.sh kernels`` runs this
first and, on a failure, times the rest through Triton's path.

Usage::

    python benchmarks/check_launcher.py            # CUDA
    TRITON_INTERPRET=1 python benchmarks/check_launcher.py --device cpu --num-items 300   # runs, compares nothing new
"""

from __future__ import annotations

import argparse
import sys

import torch

DIFFER_STATUS = 3  # the exit status when the direct launches differ from Triton's path (1: a crash)


def losses():
    import mlloss

    options = dict(backend="triton")
    return {
        "AUC": (mlloss.AUCLoss(**options), False, 1),
        "AUC grouped": (mlloss.AUCLoss(**options), True, 1),
        "LaA": (mlloss.LaALoss(**options), False, 2),
        "LaA grouped": (mlloss.LaALoss(**options), True, 2),
        "LoA": (mlloss.LoALoss(num_labels=2, **options), False, 2),
        "AUC, 2,000 items (dense kernels)": (mlloss.AUCLoss(**options), False, 1),
        "LaA grouped, 2,000 items (dense kernels)": (mlloss.LaALoss(**options), True, 2),
        "PDAOM": (mlloss.PDAOMLoss(**options), True, 1),
        "PDAOM ungrouped": (mlloss.PDAOMLoss(**options), False, 1),
    }


def run(loss_fn, scores, labels, groups):
    scores = scores.detach().clone().requires_grad_(True)
    loss = loss_fn(scores, labels, groups)
    loss.backward()
    return loss.detach().clone(), scores.grad.clone()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--num-items", type=int, default=20_000)
    args = parser.parse_args(argv)
    if args.num_items < 2:  # no pair: the losses launch no kernel, and "bit-identical" compared nothing
        parser.error(f"--num-items must be >= 2 (fewer items make no pair, so no kernel is launched); got {args.num_items}")
    from mlloss.kernels import _launch

    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    n = args.num_items
    scores = torch.randn(n, generator=generator).to(device)
    label_bits = (torch.rand(n, 2, generator=generator) < torch.tensor([0.3, 0.1])).float().to(device)
    groups = torch.randint(0, max(n // 50, 2), (n,), generator=generator).to(device)  # users of ~50 items, at least 2
    failures = []
    for name, (loss_fn, grouped, num_labels) in losses().items():
        labels = label_bits[:, 0] if num_labels == 1 else label_bits
        before = len(failures)
        size = min(n, 2000) if "2,000" in name else n
        call = (scores[:size], labels[:size], groups[:size] if grouped else None)
        try:
            _launch.DIRECT = True
            direct = [run(loss_fn, *call) for _ in range(3)]
            _launch.DIRECT = False
            triton_path = [run(loss_fn, *call) for _ in range(3)]
        finally:
            _launch.DIRECT = True
        for i, ((loss, grad), (ref_loss, ref_grad)) in enumerate(zip(direct, triton_path)):
            if not (torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)):
                failures.append(f"{name}, call {i + 1}: direct launches give loss {loss.item():.9g}, Triton's path "
                                f"{ref_loss.item():.9g}; gradients differ at {int((grad != ref_grad).sum())} of {size}")
        print(f"{name}: loss {direct[-1][0].item():.9g}" + (" (differs)" if len(failures) > before else ""))
    for line in failures:
        print("MISMATCH", line)
    print("direct launches: " + ("differ from Triton's path" if failures else "bit-identical to Triton's path"))
    return DIFFER_STATUS if failures else 0  # not 1: a crash's status


if __name__ == "__main__":
    sys.exit(main())
