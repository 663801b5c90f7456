"""What a new user of fastln meets first in the pure-Python layer.

* Submodules load on first use: ``import fastln; fastln.rnn.LNLSTM`` works,
  and ``import fastln`` imports neither dask, onnx nor torch.
* Torch tensors: accepted where arrays are (results are NumPy arrays); a tensor
  that requires grad is a TypeError naming the argument. A tensor is held to
  the dtype rule of an ndarray of its dtype, in every call that takes data (a
  recurrent model's forward, step, backward, StreamTable, StreamBatcher, for
  float32, float64, bfloat16 and int8 models; the layers): the same result,
  or the same TypeError naming the argument (a float64 tensor into a float32
  model is refused, never cast silently).
* A shape mismatch between x and a weight, bias or statistic shows x's shape,
  the argument's shape and the normalized shape.
* RMSNorm has no bias: a bias passed positionally to an RMSNorm function
  (fastln's, fastln.reference's, fastln.dask's) is a TypeError that names the
  LayerNorm function with one; the signatures show only what is accepted.
* One backward per forward, for every layer and recurrent model: a backward
  consumes its forward's cache, and a second one raises a RuntimeError that
  says to call forward again.
* The examples' command lines: results land in the current directory by
  default, every option shows its default in --help, and settings that make
  no sense are argparse errors.
* The comments of the pure-Python modules carry no measurement logs nor
  references to issues or to files outside the repository.
"""
import asyncio
import glob
import os
import re
import sys

import numpy as np
import pytest

import fastln
import fastln.rnn

from _util import assert_every_option_shows_its_default, run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)

import longer_sequences  # noqa: E402
import sequential_digits  # noqa: E402

F32 = np.float32
RNN_CLASSES = ["LNRNN", "LNLSTM", "LNGRU", "LSTM", "RNN"]


# ---------------------------------------------------------------- lazy submodules

def test_import_fastln_leaves_heavy_modules_out_and_loads_submodules_on_use():
    r = run_python("""if True:
        import sys
        import numpy as np
        import fastln
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "onnx", "torch"))
        assert not heavy, heavy
        assert "fastln.rnn" not in sys.modules and "fastln.reference" not in sys.modules
        assert {"rnn", "dask", "reference", "rnn_reference", "layers"} <= set(dir(fastln))
        m = fastln.rnn.LNLSTM(3, 4, seed=0)
        y, (h, c) = m(np.ones((2, 1, 3), np.float32))
        assert y.shape == (2, 1, 4)
        assert fastln.reference.layer_norm([[1.0, 3.0]]).shape == (1, 2)
        assert callable(fastln.rnn_reference.lnlstm_forward)
        assert "dask" not in sys.modules      # loading fastln.rnn needs no dask
        try:
            fastln.no_such_thing
        except AttributeError as e:
            assert "no_such_thing" in str(e), e
        else:
            raise AssertionError("fastln.no_such_thing did not raise")
        print("OK")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stdout + r.stderr


def test_fastln_dask_reachable_as_an_attribute():
    pytest.importorskip("dask.array")
    r = run_python("""if True:
        import dask.array as da, numpy as np, fastln
        y = fastln.dask.layer_norm(da.ones((4, 8), chunks=(2, 8)))
        assert np.allclose(y.compute(), 0.0)
        print("OK")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stdout + r.stderr


# ---------------------------------------------------------------- RMSNorm has no bias

def _rms_calls():
    """(call, the function with a bias the error names) for each RMSNorm function
    given a bias positionally, as its LayerNorm counterpart takes it."""
    import fastln.reference as ref
    x, w = np.ones((2, 4), F32), np.ones(4, F32)
    calls = [
        (lambda: fastln.rms_norm(x, w, w), "fastln.layer_norm(x, weight, bias)"),
        (lambda: fastln.rms_norm(x, w, None), "fastln.layer_norm(x, weight, bias)"),
        (lambda: fastln.rms_norm(x.astype(np.float16), w, w), "fastln.layer_norm("),
        (lambda: fastln.add_rms_norm(x, x, w, w),
         "fastln.add_layer_norm(x, residual, weight, bias)"),
        (lambda: ref.rms_norm(x, w, w), "fastln.reference.layer_norm(x, weight, bias)"),
        (lambda: ref.add_rms_norm(x, x, w, w), "fastln.reference.add_layer_norm("),
    ]
    try:
        import dask.array as da
    except ImportError:
        return calls
    import fastln.dask
    return calls + [(lambda: fastln.dask.rms_norm(da.ones((2, 4)), w, w),
                     "fastln.dask.layer_norm(x, weight, bias)")]


@pytest.mark.parametrize("i", range(len(_rms_calls())))
def test_rms_norm_with_a_bias_names_the_layer_norm_function(i):
    call, with_bias = _rms_calls()[i]
    with pytest.raises(TypeError) as info:
        call()
    msg = str(info.value)
    assert "RMSNorm has no bias" in msg and with_bias in msg, msg
    assert re.search(r"takes at most \d positional arguments \(x, (residual, )?weight\) "
                     r"but \d were given", msg), msg


def test_rms_norm_signatures_show_what_they_accept():
    import inspect

    import fastln.reference as ref
    for f in (fastln.rms_norm, fastln.add_rms_norm, ref.rms_norm, ref.add_rms_norm):
        params = inspect.signature(f).parameters.values()
        assert not any(p.kind is p.VAR_POSITIONAL for p in params), f
        assert [p.name for p in params if p.kind is p.KEYWORD_ONLY][-1] == "return_stats", f
    for f in (fastln.rms_norm, fastln.add_rms_norm):   # Cython's signature line in the doc
        line = f.__doc__.splitlines()[0]
        assert line.startswith(f"{f.__name__}(x, ") and ", *, " in line and "*bias" not in line
    # the keyword-only arguments stay keyword-only; weight by name works
    x = np.arange(8, dtype=F32).reshape(2, 4)
    with pytest.raises(TypeError, match="RMSNorm has no bias"):
        fastln.rms_norm(x, None, -1)
    np.testing.assert_array_equal(fastln.rms_norm(x, weight=np.ones(4, F32), axis=-1),
                                  fastln.rms_norm(x))


# ---------------------------------------------------------------- torch tensors

def _calls(torch, t):
    """(argument name, call) pairs that pass the tensor t as that argument."""
    x = np.ones((3, 4), F32)
    y, mean, rstd = fastln.layer_norm(x, return_stats=True)
    t4, t3 = t((3, 4)), t((3,))
    return [
        ("x", lambda: fastln.layer_norm(t4)),
        ("weight", lambda: fastln.layer_norm(x, t((4,)))),
        ("bias", lambda: fastln.layer_norm(x, None, t((4,)))),
        ("x", lambda: fastln.rms_norm(t4)),
        ("residual", lambda: fastln.add_layer_norm(x, t4)),
        ("dy", lambda: fastln.layer_norm_backward(t4, x, mean, rstd)),
        ("mean", lambda: fastln.layer_norm_backward(x, x, t3, rstd)),
        ("rstd", lambda: fastln.rms_norm_backward(x, x, t3)),
        ("x", lambda: fastln.LayerNorm(4)(t4)),
        ("x", lambda: fastln.RMSNorm(4).forward(t4)),
        ("x", lambda: fastln.rnn.LNLSTM(4, 2)(t((2, 3, 4)))),
        ("state", lambda: fastln.rnn.LNGRU(4, 2)(np.ones((2, 3, 4), F32), t((1, 3, 2)))),
        ("x_t", lambda: fastln.rnn.RNN(4, 2).step(t4)),
    ]


def test_tensor_that_requires_grad_names_the_argument(torch):
    def t(shape):
        return torch.ones(shape, requires_grad=True)

    for name, call in _calls(torch, t):
        with pytest.raises(TypeError) as info:
            call()
        msg = str(info.value)
        assert msg.startswith(f"{name} is a torch tensor that requires grad"), msg
        assert f"{name}.detach()" in msg, msg


def test_layer_backward_refuses_dy_that_requires_grad(torch):
    ln = fastln.LayerNorm(4)
    ln(np.ones((2, 4), F32))
    with pytest.raises(TypeError, match=r"^dy is a torch tensor that requires grad"):
        ln.backward(torch.ones(2, 4, requires_grad=True))
    m = fastln.rnn.LNRNN(4, 2)
    y, _ = m(np.ones((3, 2, 4), F32))
    with pytest.raises(TypeError, match=r"^dy is a torch tensor that requires grad"):
        m.backward(torch.ones(3, 2, 2, requires_grad=True))


def test_tensors_without_grad_give_numpy_results(torch):
    def t(shape):
        return torch.ones(shape)

    for _, call in _calls(torch, t):
        out = call()
        parts = out if isinstance(out, tuple) else (out,)
        for p in parts:
            for a in (p if isinstance(p, tuple) else (p,)):
                assert type(a) is np.ndarray, (call, type(a))
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    np.testing.assert_array_equal(fastln.layer_norm(x), fastln.layer_norm(x.numpy()))
    detached = torch.randn(5, 8, requires_grad=True).detach()
    assert type(fastln.rms_norm(detached)) is np.ndarray


def test_bfloat16_tensor(torch):
    pytest.importorskip("ml_dtypes")
    x = torch.randn(4, 8).bfloat16()
    y = fastln.layer_norm(x)
    assert str(y.dtype) == "bfloat16"
    np.testing.assert_allclose(y.astype(F32), fastln.layer_norm(x.float().numpy()),
                               atol=0.02)


# A tensor is held to the dtype rule of an ndarray of its dtype: a recurrent model refuses
# any dtype but its own (TypeError naming the argument, never a silent cast), a layer's output
# follows x's dtype. Every call that takes data, with every kind of model, runs on the same
# values as an ndarray and as a tensor, and must come out the same.

T_, B_, I_, H_ = 2, 3, 4, 5
_DATA_DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "bool"]


def _model(kind):
    m = fastln.rnn.LNLSTM(I_, H_, seed=0, dtype=np.float64 if kind == "float64" else F32)
    if kind == "bfloat16":
        return m.to(pytest.importorskip("ml_dtypes").bfloat16)
    return fastln.rnn.quantize(m) if kind == "int8" else m


def _batcher_step(model, a):
    async def run():
        table = fastln.rnn.StreamTable(model, capacity=2)
        sid = table.open()
        async with fastln.rnn.StreamBatcher(table) as batcher:
            return await batcher.step(sid, a)
    return asyncio.run(run())


def _data_calls(kind):
    """(argument name, shape, the dtypes it takes, call(a)) for every call that takes data
    a: the recurrent ones on a model of kind, and the layers' with a float32 model (None:
    any real dtype, the result following it)."""
    m = _model(kind)
    sdt = np.dtype(np.float64 if kind == "float64" else F32)   # the state's dtype
    x, h = np.ones((T_, B_, I_), m.dtype), np.zeros((1, B_, H_), sdt)
    takes = {sdt.name, "bfloat16"} if kind == "bfloat16" else {sdt.name}

    def trained():
        m.forward(x)
        return m

    def table_step(a):
        table = fastln.rnn.StreamTable(m, capacity=B_)
        return table.step([table.open() for _ in range(B_)], a)

    calls = [("x", (T_, B_, I_), takes, lambda a: m.forward(a, cache=False)),
             ("state", (1, B_, H_), {sdt.name}, lambda a: m.forward(x, (h, a), cache=False)),
             ("x_t", (B_, I_), takes, lambda a: m.step(a)),
             ("state", (1, B_, H_), {sdt.name}, lambda a: m.step(x[0], (a, h))),
             ("x", (B_, I_), takes, table_step),
             ("x", (I_,), takes, lambda a: _batcher_step(m, a))]
    if kind in ("float32", "float64"):
        calls += [("dy", (T_, B_, H_), takes, lambda a: trained().backward(a)),
                  ("dstate", (1, B_, H_), takes,
                   lambda a: trained().backward(np.ones((T_, B_, H_), sdt), (None, a)))]
    if kind == "float32":
        def layer_backward(a):
            ln = fastln.LayerNorm(I_)
            ln(np.ones((B_, I_), F32))
            return ln.backward(a)
        calls += [("x", (B_, I_), None, fastln.LayerNorm(I_)),
                  ("x", (B_, I_), None, fastln.RMSNorm(I_)),
                  ("dy", (B_, I_), None, layer_backward)]
    return calls


def _outcome(call, a):
    """What call(a) gives: the exception's type and message (the conversion it suggests
    apart: .astype for an ndarray, .to for a tensor), or every array's type, dtype and
    bytes."""
    try:
        out = call(a)
    except (TypeError, ValueError) as e:
        message, _, hint = str(e).partition("; convert it with ")
        return type(e), message, hint
    flat, todo = [], [out]
    while todo:
        item = todo.pop(0)
        if isinstance(item, tuple):
            todo[:0] = list(item)
        else:
            flat.append((type(item), str(item.dtype), item.tobytes()))
    return flat


@pytest.mark.parametrize("kind", ["float32", "float64", "bfloat16", "int8"])
def test_tensors_follow_the_dtype_rule_of_ndarrays(torch, kind):
    rng = np.random.default_rng(0)
    for name, shape, takes, call in _data_calls(kind):
        base = rng.uniform(-2, 2, shape).astype(F32)
        for dtype in _DATA_DTYPES:
            if dtype == "bfloat16":
                array = base.astype(pytest.importorskip("ml_dtypes").bfloat16)
                tensor = torch.from_numpy(base).bfloat16()
            else:
                array = (base > 0) if dtype == "bool" else base.astype(dtype)
                tensor = torch.from_numpy(array)
            as_array, as_tensor = _outcome(call, array), _outcome(call, tensor)
            if takes is None or dtype in takes:
                assert isinstance(as_array, list), (name, dtype, as_array)
                assert as_tensor == as_array, (name, dtype)
                continue
            # refused alike, naming the argument, each with its own conversion
            assert as_array[:2] == as_tensor[:2], (name, dtype, as_array, as_tensor)
            assert as_array[0] is TypeError and as_array[1].startswith(f"{name} has dtype "), \
                (name, dtype, as_array)
            assert as_array[2].startswith(f"{name}.astype(np."), as_array
            assert as_tensor[2].startswith(f"{name}.to(torch."), as_tensor


# ---------------------------------------------------------------- shape messages

def _shape_error(call):
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("func", ["layer_norm", "rms_norm"])
def test_weight_shape_error_shows_x_and_weight(func):
    x, w = np.ones((32, 512), F32), np.ones(768, F32)
    msg = _shape_error(lambda: getattr(fastln, func)(x, w))
    assert "weight has shape (768,)" in msg and "(32, 512)" in msg and "(512,)" in msg, msg


def test_shape_errors_show_both_shapes_everywhere():
    x = np.ones((2, 3, 4))
    good = np.ones(4)
    y, mean, rstd = fastln.layer_norm(x, return_stats=True)
    _, rrstd = fastln.rms_norm(x, return_stats=True)
    cases = [
        ("bias", (5,), lambda: fastln.layer_norm(x, good, np.ones(5))),
        ("bias", (3,), lambda: fastln.add_layer_norm(x, x, good, np.ones(3))),
        ("weight", (6,), lambda: fastln.add_layer_norm(x, x, np.ones(6))),
        ("weight", (2,), lambda: fastln.layer_norm_backward(x, x, mean, rstd, np.ones(2))),
        ("weight", (2,), lambda: fastln.rms_norm_backward(x, x, rrstd, np.ones(2))),
        ("mean", (3,), lambda: fastln.layer_norm_backward(x, x, np.ones(3), rstd)),
        ("rstd", (2, 4), lambda: fastln.rms_norm_backward(x, x, np.ones((2, 4)))),
    ]
    for name, shape, call in cases:
        msg = _shape_error(call)
        assert f"{name} has shape {shape}" in msg and "x has shape (2, 3, 4)" in msg, msg
        assert "(4,)" in msg or "(2, 3)" in msg, msg   # the normalized or batch shape


def test_shape_error_names_the_normalized_axes():
    x = np.ones((2, 3, 4))
    msg = _shape_error(lambda: fastln.layer_norm(x, np.ones((3, 5)), axis=(1, 2)))
    assert "(3, 5)" in msg and "(3, 4)" in msg and "(2, 3, 4)" in msg, msg
    assert "axes (1, 2)" in msg, msg


def test_dask_shape_error_shows_xs_shape():
    da = pytest.importorskip("dask.array")
    import fastln.dask

    x = da.ones((32, 512), chunks=(8, 512))
    msg = _shape_error(lambda: fastln.dask.layer_norm(x, np.ones(768)))
    assert "weight has shape (768,)" in msg and "(32, 512)" in msg and "(512,)" in msg, msg


# ---------------------------------------------------------------- one backward per forward

def _layer_case(cls):
    layer = getattr(fastln, cls)(4)
    x = np.arange(12, dtype=F32).reshape(3, 4)
    return layer, (lambda: layer.forward(x)), (lambda: layer.backward(np.ones((3, 4), F32))), \
        (lambda: layer.backward(np.ones((3, 5), F32)))


def _rnn_case(cls):
    model = getattr(fastln.rnn, cls)(3, 4, num_layers=2, seed=0)
    x = np.ones((5, 2, 3), F32)
    return model, (lambda: model.forward(x)), \
        (lambda: model.backward(np.ones((5, 2, 4), F32))), \
        (lambda: model.backward(np.ones((5, 2, 5), F32)))


CASES = [("layer", c) for c in ("LayerNorm", "RMSNorm")] + [("rnn", c) for c in RNN_CLASSES]


@pytest.mark.parametrize("kind, cls", CASES)
def test_second_backward_raises(kind, cls):
    obj, forward, backward, bad_backward = (_layer_case if kind == "layer" else _rnn_case)(cls)
    with pytest.raises(RuntimeError, match="call forward"):
        backward()                      # no forward yet
    forward()
    first = backward()
    with pytest.raises(RuntimeError, match=r"call forward\(x\) again"):
        backward()
    forward()
    again = backward()                  # a new forward serves a new backward
    a, b = (first, again) if kind == "layer" else (first[0], again[0])
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind, cls", CASES)
def test_failed_backward_keeps_the_cache(kind, cls):
    obj, forward, backward, bad_backward = (_layer_case if kind == "layer" else _rnn_case)(cls)
    forward()
    with pytest.raises(ValueError):
        bad_backward()
    backward()                          # the forward's cache is still there


@pytest.mark.parametrize("kind, cls", CASES)
def test_backward_frees_the_cache(kind, cls):
    obj, forward, backward, _ = (_layer_case if kind == "layer" else _rnn_case)(cls)
    forward()
    assert obj._cache is not None
    backward()
    assert obj._cache is None


@pytest.mark.parametrize("kind, cls", CASES)
def test_backward_rule_is_documented(kind, cls):
    obj = (_layer_case if kind == "layer" else _rnn_case)(cls)[0]
    doc = type(obj).backward.__doc__
    assert "consum" in doc and "RuntimeError" in doc, doc
    assert re.search(r"[Cc]all :meth:`forward` again", doc), doc


# ---------------------------------------------------------------- the examples' command lines

SCRIPTS = {"sequential_digits": sequential_digits, "longer_sequences": longer_sequences}


@pytest.mark.parametrize("script, argv", [
    ("sequential_digits", ["--epochs", "0"]),
    ("sequential_digits", ["--epochs", "-3"]),
    ("sequential_digits", ["--hidden", "0"]),
    ("sequential_digits", ["--batch-size", "-1"]),
    ("sequential_digits", ["--pixels-per-step", "0"]),
    ("sequential_digits", ["--pixels-per-step", "3"]),
    ("sequential_digits", ["--seeds", "0"]),
    ("sequential_digits", ["--seeds", "1,-2"]),
    ("sequential_digits", ["--lrs", "0"]),
    ("sequential_digits", ["--lrs", "1e-3,nan"]),
    ("sequential_digits", ["--lrs", ","]),
    ("sequential_digits", ["--clip", "-1"]),
    ("sequential_digits", ["--threshold", "1.5"]),
    ("sequential_digits", ["--subset", "0"]),
    ("sequential_digits", ["--threads", "0"]),
    ("sequential_digits", ["--perm-seed", "-1"]),
    ("longer_sequences", ["--steps", "0"]),
    ("longer_sequences", ["--hidden", "-8"]),
    ("longer_sequences", ["--batch-size", "0"]),
    ("longer_sequences", ["--min-T", "1"]),
    ("longer_sequences", ["--min-T", "20", "--max-T", "10"]),
    ("longer_sequences", ["--eval-T", "1,50"]),
    ("longer_sequences", ["--eval-size", "0"]),
    ("longer_sequences", ["--eval-every", "0"]),
    ("longer_sequences", ["--threshold", "0"]),
    ("longer_sequences", ["--clip", "-0.5"]),
    ("longer_sequences", ["--lrs", "-1e-3"]),
    ("longer_sequences", ["--seeds", "x"]),
])
def test_examples_reject_settings_that_make_no_sense(script, argv, capsys):
    with pytest.raises(SystemExit) as info:
        SCRIPTS[script].parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and "error" in err, err


@pytest.mark.parametrize("argv, name", [
    ([], "sequential_digits.png"),
    (["--pixels-per-step", "1"], "sequential_digits_1px.png"),
    (["--binarize"], "sequential_digits_binary.png"),
    (["--out", "elsewhere.png"], "elsewhere.png"),
])
def test_digits_writes_to_the_current_directory_by_default(argv, name):
    out = sequential_digits.parse_args(argv).out
    assert out == name and not os.path.dirname(out), out


def test_adding_writes_to_the_current_directory_by_default():
    out = longer_sequences.parse_args([]).out
    assert out == "longer_sequences.png", out


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_examples_defaults_are_sensible(script):
    args = SCRIPTS[script].parse_args([])
    assert args.seeds == [0, 1, 2] and all(lr > 0 for lr in args.lrs)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_example_option_has_help_and_shows_its_default(script):
    assert_every_option_shows_its_default(SCRIPTS[script].make_parser())


# ---------------------------------------------------------------- comments

OWNED = ["fastln/__init__.py", "fastln/_general.py", "fastln/_layout.py", "fastln/_validate.py",
         "fastln/_dtypes.py", "fastln/layers.py",
         *sorted(os.path.relpath(p, ROOT)
                 for p in glob.glob(os.path.join(ROOT, "fastln", "rnn", "*.py"))),
         "fastln/dask.py", "fastln/_memory.py", "fastln/_torch.py", "fastln/reference.py",
         "fastln/rnn_reference.py", "examples/_common.py", "examples/sequential_digits.py",
         "examples/longer_sequences.py"]
FORBIDDEN = [r"DESIGN\.md", r"\bissue \d", r"\bstop \d", r"\bsession", r"on this machine",
             r"\d\s?ms\b", r"\d(\.\d+)?x (faster|slower)", r"\.\./"]


@pytest.mark.parametrize("path", OWNED)
def test_comments_carry_no_logs_nor_outside_references(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    for pattern in FORBIDDEN:
        m = re.search(pattern, text)
        assert m is None, (path, pattern, text[max(0, m.start() - 60):m.end() + 60])
