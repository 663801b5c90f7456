"""Model files and the single-stream reference run of the served model.

A model file is an ``.npz`` holding a fastln.rnn model's ``state_dict()`` and
``config``, a JSON string such as::

    {"class": "LNLSTM", "input_size": 128, "hidden_size": 256, "num_layers": 1,
     "dtype": "bfloat16", "eps": 1e-05}

(with ``nonlinearity`` or ``linear_before_reset`` for the classes that have
them). A bfloat16 model's arrays are stored as float32, which holds bfloat16
values exactly; :func:`load_model` converts them back with ``model.to``.

dtype "int8" is a model of ``fastln.rnn.quantize``: int8 weight matrices with
a float32 scale per row (``weight_ih_scale_l{k}``, ``weight_hh_scale_l{k}``),
the other parameters float32; its x, y and state are float32. The file stores
the int8 arrays and the scales as they are; :func:`load_model` builds the
float32 model of the config, quantizes it for the int8 structure, and loads
the saved arrays into it, so the loaded model equals the saved one bit for bit.

:func:`load_model` also reads an ``.npz`` of a bare state_dict
(``np.savez(path, **model.state_dict())``): the parameter names and shapes
give the class, the sizes, the layers and the dtype (int8 when weight_ih_l0
is int8 and the row scales are there); eps is the class's default, which the
state_dict does not hold. An RNN, LNRNN or GRU needs the config entry, as its
nonlinearity or linear_before_reset changes the outputs and leaves the
parameters alike.

Write a new LN-LSTM (default initialization) to a file, for fastln-serve::

    python -m fastln.serve.model model.npz [--input 128 --hidden 256 --layers 1
        --dtype float32|bfloat16|int8 --seed 0]

(int8: the float32 model of that seed, quantized with ``fastln.rnn.quantize``.)
"""
import argparse
import json
import os
import re

import numpy as np

from fastln import rnn
from fastln._dtypes import bfloat16

CLASSES = {name: getattr(rnn, name) for name in ("LNLSTM", "LNGRU", "LNRNN", "LSTM", "GRU", "RNN")}
# a model file's dtype: the model's dtype, or "int8" for a quantized model (whose
# model.dtype is float32)
DTYPES = ("float32", "float64", "bfloat16", "int8")
# the settings that change a model's outputs but not its parameters' names and shapes
HIDDEN_SETTINGS = {"RNN": "nonlinearity ('tanh' or 'relu')",
                   "LNRNN": "nonlinearity ('tanh' or 'relu')",
                   "GRU": "linear_before_reset (True or False)"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help keeps the description's line breaks and shows every option's default."""


def dtype_name(model):
    """The model's dtype as one of DTYPES: "int8" for a model of
    fastln.rnn.quantize, else model.dtype's name."""
    int8 = model.params["weight_ih_l0"].dtype == np.int8   # its weight matrices say so
    return "int8" if int8 else np.dtype(model.dtype).name


def input_dtype(model):
    """The dtype x is given in: the model's, or float32 for a bfloat16 or an
    int8 model."""
    name = dtype_name(model)
    return np.dtype(np.float32 if name in ("bfloat16", "int8") else name)


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
    if model.proj_size:
        raise ValueError("model has proj_size, which the served protocols do not carry (their "
                         "y has hidden_size features): step it with StreamTable or "
                         "StreamBatcher in your own service")


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
    if name == "LNLSTM":   # a variant's options, where they differ from the paper cell's
        cfg.update(model._options().changed())
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
    """Marks the parameters read-only, so that nothing changes the served
    model by mistake: a write to one raises. The engine keeps a packed copy
    only of weights that no write can reach, whose memory is a bytes object
    (a bfloat16 or int8 model's matrices); read-only arrays that own their
    memory, or view an array that does, it packs again on every call."""
    for a in model.params.values():
        a.flags.writeable = False
    return model


def _read_npz(path):
    """The arrays of the .npz file path, as a dict; ValueError for a file that is
    not one (FileNotFoundError for a missing one)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    try:
        f = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:   # not .npy/.npz: NumPy takes it for a pickle
        raise ValueError(f"{path} is not an .npz file ({type(e).__name__}); a model file is "
                         f"an .npz of save_model or of np.savez(path, **model.state_dict())"
                         ) from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} holds one array (an .npy file), not an .npz of a model's "
                         f"parameters")
    with f:
        return {key: f[key] for key in f.files}


def _layout(cls):
    """The parameter names of cls's models (without the layer's _l{k}), and
    the rows of weight_hh per hidden unit (the gates), from a model of one unit."""
    params = cls(1, 1).params
    return {key[:-len("_l0")] for key in params}, params["weight_hh_l0"].shape[0]


def infer_config(arrays, path="the file"):
    """The config of a forward model whose state_dict is ``arrays`` (a dict of
    parameter name to array, as np.savez(path, **model.state_dict()) writes it):
    the class from the parameter names (and, for LSTM and RNN, which share them,
    the rows of weight_hh), the sizes from the shapes, num_layers from the
    names, the dtype from weight_ih_l0's (int8 when the arrays hold the row
    scales of fastln.rnn.quantize); eps is the class default. ValueError
    when the arrays do not fit one class, or fit one whose outputs depend on a
    setting the parameters do not show (HIDDEN_SETTINGS)."""
    how = ("write it with save_model (fastln.serve.model: "
           "save_model(path, model)), which stores the model's config next to its "
           "state_dict")
    names, layers = set(), set()
    for key in arrays:
        m = re.fullmatch(r"(\w+?)_l(\d+)(_reverse)?", key)
        if m is None:
            raise ValueError(f"{path} has no config entry and {key!r} is not a parameter "
                             f"name of a fastln.rnn state_dict; {how}")
        if m.group(3):
            raise ValueError(f"{path} holds a bidirectional model ({key}); a stream is "
                             f"served one step at a time, forward only")
        names.add(m.group(1))
        layers.add(int(m.group(2)))
    # an int8 model's row scales (fastln.rnn.quantize) sit beside the layout's names
    scales = {"weight_ih_scale", "weight_hh_scale"}
    int8 = bool(names & scales)
    names -= scales
    if "weight_ih_l0" not in arrays or "weight_hh_l0" not in arrays:
        raise ValueError(f"{path} has no config entry, nor weight_ih_l0 and weight_hh_l0 "
                         f"of a fastln.rnn state_dict; {how}")
    w_ih, w_hh = arrays["weight_ih_l0"], arrays["weight_hh_l0"]
    if w_ih.ndim != 2 or w_hh.ndim != 2 or w_hh.shape[1] == 0:
        raise ValueError(f"{path}: weight_ih_l0 {w_ih.shape} and weight_hh_l0 {w_hh.shape} "
                         f"are not the weight matrices of a fastln.rnn model")
    hidden = w_hh.shape[1]
    gates = w_hh.shape[0] // hidden
    fits = [name for name, cls in CLASSES.items() if _layout(cls) == (names, gates)]
    if len(fits) != 1:
        raise ValueError(f"{path} has no config entry, and its parameters "
                         f"({', '.join(sorted(names))}; weight_hh_l0 {w_hh.shape}) fit "
                         f"{'none' if not fits else ' and '.join(fits)} of "
                         f"{', '.join(CLASSES)}; {how}")
    name = fits[0]
    if name in HIDDEN_SETTINGS:
        article = "a" if name == "GRU" else "an"
        raise ValueError(f"{path} has no config entry: it holds {article} {name} state_dict, "
                         f"whose {HIDDEN_SETTINGS[name]} the parameters do not show; {how}")
    if w_ih.dtype.kind == "V" and w_ih.dtype.itemsize == 2:   # bfloat16, as np.savez keeps it
        dtype = "bfloat16"
    elif int8:
        if w_ih.dtype != np.int8 or w_hh.dtype != np.int8:
            raise ValueError(f"{path}: an int8 model's state_dict (it has row scales) holds "
                             f"int8 weight matrices, got weight_ih_l0 {w_ih.dtype} and "
                             f"weight_hh_l0 {w_hh.dtype}")
        dtype = "int8"
    else:
        dtype = np.dtype(w_ih.dtype).name
        if dtype == "int8":
            raise ValueError(f"{path}: weight_ih_l0 is int8 and the row scales of an int8 "
                             f"model (weight_ih_scale_l0, weight_hh_scale_l0, ...) are "
                             f"missing")
    if dtype not in DTYPES:
        raise ValueError(f"{path}: weight_ih_l0 has dtype {dtype}, expected one of {DTYPES}")
    return {"class": name, "input_size": int(w_ih.shape[1]), "hidden_size": int(hidden),
            "num_layers": max(layers) + 1, "dtype": dtype}


def load_model(path):
    """The model saved in ``path`` by save_model, or by np.savez of a forward
    LNLSTM, LNGRU or LSTM's state_dict, float or int8 (see infer_config), with
    read-only weights. An int8 model is the float32 model of the config passed
    through fastln.rnn.quantize (which gives the int8 structure: the matrices'
    dtype and the scale parameters), then loaded with the saved arrays.
    FileNotFoundError for a missing file, ValueError for one that is neither."""
    arrays = _read_npz(path)
    if "config" in arrays:
        cfg = json.loads(str(arrays.pop("config")))
    else:
        cfg = infer_config(arrays, path)
    kwargs = dict(cfg)
    name, dtype = kwargs.pop("class"), kwargs.pop("dtype")
    if name not in CLASSES:
        raise ValueError(f"{path}: class {name!r} is not one of {', '.join(CLASSES)}")
    if dtype not in DTYPES:
        raise ValueError(f"{path}: dtype {dtype!r} is not one of {DTYPES}")
    if dtype == "bfloat16":   # bfloat16 matrices of a bare state_dict, stored as 2-byte voids
        arrays = {key: a.view(bfloat16()).astype(np.float32)
                  if a.dtype.kind == "V" and a.dtype.itemsize == 2 else a
                  for key, a in arrays.items()}
    model = CLASSES[name](dtype=np.float32 if dtype in ("bfloat16", "int8") else dtype,
                          **kwargs)
    if dtype == "int8":   # the default weights are replaced by the saved ones just below
        model = rnn.quantize(model)
    try:
        model.load_state_dict(arrays)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
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


def make_parser():
    """The command line's parser; every option shows its default in --help."""
    p = argparse.ArgumentParser(prog="python -m fastln.serve.model",
                                description="Writes a new LN-LSTM to a model file.",
                                formatter_class=HelpFormatter)
    p.add_argument("path", help="the .npz file to write")
    p.add_argument("--input", type=int, default=128, help="input_size I")
    p.add_argument("--hidden", type=int, default=256, help="hidden_size H")
    p.add_argument("--layers", type=int, default=1, help="num_layers")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "int8"], default="float32",
                   help="the model's dtype; int8: the float32 model quantized by "
                        "fastln.rnn.quantize (int8 weights with float32 row scales; x, y "
                        "and state float32)")
    p.add_argument("--seed", type=int, default=0, help="seeds the initial weights")
    return p


def main(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    try:
        model = rnn.LNLSTM(args.input, args.hidden, args.layers, seed=args.seed)
    except (TypeError, ValueError) as e:   # sizes below 1
        p.error(f"--input, --hidden and --layers: {e}")
    if args.dtype == "bfloat16":
        model = model.to(bfloat16())
    elif args.dtype == "int8":
        model = rnn.quantize(model)
    try:
        save_model(args.path, model)
    except OSError as e:
        p.error(f"cannot write {args.path}: {e.strerror or e}")
    print(f"wrote {args.path}: {json.dumps(config_of(model))}")


if __name__ == "__main__":
    main()
