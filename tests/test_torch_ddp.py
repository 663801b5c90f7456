"""fastln.torch under DistributedDataParallel: two processes started by
torchrun with the gloo backend train on halves of a batch and end with the
gradients and parameters of one process on the whole batch.

WORKER is one process of that run, as torchrun starts it:

    python -m torch.distributed.run --standalone --nproc_per_node=2 worker.py OUT

Each rank trains the same network (a fastln.torch.LNLSTM between two linear
layers) under DDP on its half of one batch, for STEPS steps of SGD; rank 0
writes the first step's gradients and the final parameters to OUT (.npz).
With the gloo backend DDP averages the gradients, so they are those of the
mean loss over the whole batch in one process, which the test computes from
the same module (network() and batch() give its inputs)."""
import importlib.util
import os
import subprocess
import sys

import numpy as np

from _util import package_parent

WORKER = """\
import sys

import numpy as np
import torch

STEPS = 3


def network():
    import fastln.torch

    torch.manual_seed(0)
    return torch.nn.ModuleDict(dict(
        inp=torch.nn.Linear(3, 8),
        rnn=fastln.torch.LNLSTM(8, 16, num_layers=2, batch_first=True, dropout=0.0),
        out=torch.nn.Linear(16, 1)))


def forward(net, x):
    y, _ = net["rnn"](torch.tanh(net["inp"](x)))
    return net["out"](y[:, -1])


def batch():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 12, 3, generator=gen)
    return x, x.sum(dim=(1, 2))[:, None] / 12


def train(net, model, x, target, steps):
    '''steps of SGD on model (net, or its DDP wrapper); the first step's grads.'''
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    first = None
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        if step == 0:
            first = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
        opt.step()
    return first


class _Wrapped(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return forward(self.net, x)


def main(out):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = network()
    model = DistributedDataParallel(_Wrapped(net))
    x, target = batch()
    share = x.shape[0] // world
    rows = slice(rank * share, (rank + 1) * share)
    grads = train(net, model, x[rows], target[rows], STEPS)
    if rank == 0:
        arrays = {"grad." + n: g.numpy() for n, g in grads.items()}
        arrays.update({"param." + n: p.detach().numpy() for n, p in net.named_parameters()})
        np.savez(out, **arrays)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
"""


def test_two_process_gradients_match_one_process(torch, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("ddp_worker", script)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    out = tmp_path / "rank0.npz"
    env = dict(os.environ)
    env["PYTHONPATH"] = package_parent() + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2", str(script), str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = np.load(out)
    net = worker.network()
    x, target = worker.batch()
    grads = worker.train(net, lambda v: worker.forward(net, v), x, target, worker.STEPS)
    for name, g in grads.items():
        np.testing.assert_allclose(got["grad." + name], g.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    for name, p in net.named_parameters():
        np.testing.assert_allclose(got["param." + name], p.detach().numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)
