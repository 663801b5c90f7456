"""One process of tests/test_torch_ddp.py's DistributedDataParallel run, as
torchrun starts it:

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/_torch_ddp_worker.py OUT

Each rank trains the same network (a fastln.torch.LNLSTM between two linear
layers) under DDP on its half of one batch, for STEPS steps of SGD; rank 0
writes the first step's gradients and the final parameters to OUT (.npz).
With the gloo backend DDP averages the gradients, so they are those of the
mean loss over the whole batch in one process (network() and batch() give
the test that process's inputs)."""
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
    """steps of SGD on model (net, or its DDP wrapper); the first step's grads."""
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
