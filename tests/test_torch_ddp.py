"""fastln.torch under DistributedDataParallel: two processes started by
torchrun with the gloo backend train on halves of a batch and end with the
gradients and parameters of one process on the whole batch."""
import os
import subprocess
import sys

import numpy as np

from _util import package_parent

HERE = os.path.dirname(os.path.abspath(__file__))


def test_two_process_gradients_match_one_process(torch, tmp_path):
    sys.path.insert(0, HERE)
    try:
        import _torch_ddp_worker as worker
    finally:
        sys.path.remove(HERE)
    out = tmp_path / "rank0.npz"
    env = dict(os.environ)
    env["PYTHONPATH"] = package_parent() + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2", os.path.join(HERE, "_torch_ddp_worker.py"),
                        str(out)], env=env, capture_output=True, text=True, timeout=300)
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
