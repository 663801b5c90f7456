"""Model files and the single-stream reference run of the served-model example.

A model file is an ``.npz`` holding a fastln.rnn model's ``state_dict()`` and
``config``, a JSON string such as::

    {"class": "LNLSTM", "input_size": 128, "hidden_size": 256, "num_layers": 1,
     "dtype": "bfloat16", "eps": 1e-05}

(with ``nonlinearity`` or ``linear_before_reset`` for the classes that have
them). A bfloat16 model's arrays are stored as float32, which holds bfloat16
values exactly; :func:`load_model` converts them back with ``model.to``.

Write a new LN-LSTM (default initialization) to a file, for server.py::

    python examples/serve/model.py model.npz [--input 128 --hidden 256 --layers 1
        --dtype float32|bfloat16 --seed 0]
"""
import argparse
import json

import numpy as np

from fastln import rnn

CLASSES = {name: getattr(rnn, name) for name in ("LNLSTM", "LNGRU", "LNRNN", "LSTM", "GRU", "RNN")}
DTYPES = ("float32", "float64", "bfloat16")


def bfloat16():
    """ml_dtypes.bfloat16, imported only when a bfloat16 model is asked for."""
    import ml_dtypes

    return ml_dtypes.bfloat16


def dtype_name(model):
    """The model's dtype as one of DTYPES."""
    return np.dtype(model.dtype).name


def input_dtype(model):
    """The dtype x is given in: the model's, or float32 for a bfloat16 model."""
    name = dtype_name(model)
    return np.dtype(np.float32 if name == "bfloat16" else name)


def check_streamable(model):
    """Raises ValueError unless ``model`` is a fastln.rnn model that step() runs."""
    if type(model).__name__ not in CLASSES or not callable(getattr(model, "step", None)):
        raise ValueError(f"model must be one of fastln.rnn's {', '.join(CLASSES)}, "
                         f"got {type(model).__name__}")
    if model.bidirectional or model.reverse:
        raise ValueError("model must run forward in time (not bidirectional or reverse): "
                         "a stream is served one step at a time")
    if dtype_name(model) not in DTYPES:
        raise ValueError(f"model has dtype {dtype_name(model)}, expected one of {DTYPES}")


def config_of(model):
    """The JSON-ready description of ``model`` that save_model writes."""
    check_streamable(model)
    name = type(model).__name__
    cfg = {"class": name, "input_size": model.input_size, "hidden_size": model.hidden_size,
           "num_layers": model.num_layers, "dtype": dtype_name(model)}
    if name.startswith("LN"):
        cfg["eps"] = model.eps
    if name in ("LNRNN", "RNN"):
        cfg["nonlinearity"] = model.nonlinearity
    if name == "GRU":
        cfg["linear_before_reset"] = model.linear_before_reset
    return cfg


def save_model(path, model):
    """Writes ``model`` (a forward fastln.rnn model) to the ``.npz`` file ``path``."""
    cfg = config_of(model)
    arrays = {}
    for key, value in model.state_dict().items():
        value = np.asarray(value)
        arrays[key] = value.astype(np.float32) if value.dtype.name == "bfloat16" else value
    if "config" in arrays:
        raise ValueError("model has a parameter called 'config', the name of the file's "
                         "config entry")
    np.savez(path, config=np.array(json.dumps(cfg)), **arrays)


def freeze(model):
    """Marks the weights read-only, which lets the engine keep its packed copy across calls."""
    for a in model.params.values():
        a.flags.writeable = False
    return model


def load_model(path):
    """The model saved in ``path`` by save_model, with read-only weights."""
    with np.load(path, allow_pickle=False) as f:
        if "config" not in f:
            raise ValueError(f"{path} has no config entry: not a model file of save_model")
        cfg = json.loads(str(f["config"]))
        arrays = {key: f[key] for key in f.files if key != "config"}
    kwargs = dict(cfg)
    name, dtype = kwargs.pop("class"), kwargs.pop("dtype")
    if name not in CLASSES:
        raise ValueError(f"{path}: class {name!r} is not one of {', '.join(CLASSES)}")
    if dtype not in DTYPES:
        raise ValueError(f"{path}: dtype {dtype!r} is not one of {DTYPES}")
    model = CLASSES[name](dtype=np.float32 if dtype == "bfloat16" else dtype, **kwargs)
    model.load_state_dict(arrays)
    if dtype == "bfloat16":
        model = model.to(bfloat16())
    return freeze(model)


def stream_inputs(seed, stream, steps, input_size):
    """The inputs of one client stream: standard normal float32, (steps, input_size),
    from a generator seeded with (seed, stream)."""
    rng = np.random.default_rng([seed, stream])
    return rng.standard_normal((steps, input_size), dtype=np.float32)


def reference_run(model, xs):
    """y of every step of one stream run alone: B=1 steps from a zero state over
    xs (steps, input_size); returns (steps, hidden_size) in the dtype of y."""
    xs = np.asarray(xs, input_dtype(model))
    state, ys = None, []
    for x in xs:
        y, state = model.step(x[None], state)
        ys.append(y[0])
    return np.stack(ys)


def main(argv=None):
    p = argparse.ArgumentParser(description="Writes a new LN-LSTM to a model file.")
    p.add_argument("path", help="the .npz file to write")
    p.add_argument("--input", type=int, default=128, help="input_size I (default 128)")
    p.add_argument("--hidden", type=int, default=256, help="hidden_size H (default 256)")
    p.add_argument("--layers", type=int, default=1, help="num_layers (default 1)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--seed", type=int, default=0, help="seeds the initial weights")
    args = p.parse_args(argv)
    model = rnn.LNLSTM(args.input, args.hidden, args.layers, seed=args.seed)
    if args.dtype == "bfloat16":
        model = model.to(bfloat16())
    save_model(args.path, model)
    print(f"wrote {args.path}: {json.dumps(config_of(model))}")


if __name__ == "__main__":
    main()
