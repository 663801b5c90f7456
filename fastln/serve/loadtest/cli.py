"""Load test of the served model: fastln-serve in a subprocess on 127.0.0.1,
driven over its WebSocket protocols (a connection per stream, or many streams
on each of --connections multiplexed connections; binary frames) by this
process, for an LN-LSTM (I=128, H=256, default initialization, seed 0)
in each of --dtypes: float32, bfloat16 and int8 (the float32 model through
fastln.rnn.quantize: int8 weights with float32 row scales; its x and y frames
are float32), all three by default.

    python -m fastln.serve.loadtest                     # every run below, every dtype
    python -m fastln.serve.loadtest --quick             # a few streams, every run once
    python -m fastln.serve.loadtest --dtypes float32 --streams 64 --no-write
    python -m fastln.serve.loadtest --dtypes float32,int8 --runs closed --no-write

The runs, per dtype (--runs picks some of them; all by default):

- echo: --streams closed-loop streams (below) against ``fastln-serve --echo``
  (the same frames, no model): the transport's own ceiling.
- closed: --streams streams of --steps steps; each sends its next frame as soon
  as a reply comes (--inflight frames outstanding per stream).
- open: --streams streams sending at --hz on a fixed schedule, each with a
  random phase, whether or not the last reply came; latency counts from the
  scheduled send time, so a slow reply hides no later delay.
- sweep: open loop at --sweep-hz over --sweep-streams, stopping after the
  first count whose p99 reaches --p99-ms.
- restart: --restart-streams closed-loop streams; partway, the server gets
  SIGTERM and exits, a new one starts on the same --state-file, and the clients
  reconnect without new=1 and continue from the hello's t.
- mux-closed: the closed loop's streams on --connections multiplexed
  connections (fastln.serve.ws.mux, the streams split evenly among them): each
  frame holds one step of every stream of its connection, and the next goes
  when a reply comes (--inflight frames outstanding per connection). Before
  it, the engine alone in this process: ``StreamTable.step`` of 256 streams
  (B = 256, or --streams if fewer) for about a second, the "engine" row.
- mux-open: the open loop's streams on --connections multiplexed
  connections, each connection sending one frame of all its streams at --hz
  with a random phase (its streams keep one schedule, as a client that
  gathers them does).

--checkpoint dir or redis makes the server of those runs checkpoint its
streams (--checkpoint-interval), for the cost of it. Three runs of a cluster
are asked for by name only; they need nginx, redis-server and a checkout's
docs/nginx/fastln.conf (fastln.serve.loadtest.crash):

- crash, mux-crash: --crash-streams closed-loop streams over three servers
  that checkpoint to Redis, behind nginx (per-stream connections through it;
  multiplexed ones to each stream's owner); after 40% of the steps the
  server that holds the most streams is killed with SIGKILL, and its streams
  are taken over by the others and replay the steps after their latest
  checkpoint. Reports the streams lost and each moved stream's recovery,
  from the kill to its first reply.
- outage: the same cluster, --crash-streams streams at --hz in an open loop
  on multiplexed connections for 2 x --outage + 4 seconds; redis-server
  stops for --outage seconds under that load and starts again, empty.
  Reports the errors, the failed checkpoints, and how soon every server
  checkpoints again.

Every reply is compared bit for bit with the same stream run alone in this
process (fastln.serve.model's reference_run: B=1 steps over stream_inputs), echo's with
zero bytes. A "mismatch" is a reply that differs; an "error" an unexpected
close, a failed connection or a stream unfinished at the time limit; "lost" a
stream that could not resume after the restart, or whose hello's t differs
from the replies it got. The exit code is 1 if any run has one.

A multiplexed run's latencies count once per step (a frame's latency for each
of its steps), its mismatches per row.

The clients are streams on the client's wire (fastln.serve.client.wire's
Peer), which answer each reply in a callback, in one asyncio process (uvloop
when importable) on the machine of the server: the two share its cores. Prints a markdown table
and the closed loop's ratios (each dtype's steps/s over echo's, and over the
float32 model's), and writes them to RESULTS.md, and the latency plot to
serve_latency.png, in --outdir (the current folder by default; --no-write:
neither). A --quick run, or one of only some --runs, writes them only to an
--outdir given: its numbers are a smoke test or a part, and the files in the
current folder keep a full run's.
"""
import argparse
import contextlib
import os
import resource
import sys
import tempfile

import fastln

from ..extra import needs_extra
from ..model import HelpFormatter

with needs_extra(__name__):
    from .crash import default_conf
    from .report import FIGURE, RESULTS, largest_line, plot, ratios, table, write_results
    from .runs import run_all

DTYPES = ("float32", "bfloat16", "int8")
RUNS = ("echo", "closed", "open", "sweep", "restart", "mux-closed", "mux-open")
# the runs of a cluster (nginx, redis-server, three servers): asked for by name only
CLUSTER_RUNS = ("crash", "mux-crash", "outage")
CHECKPOINTS = ("none", "dir", "redis")


def names_of(what, choices):
    """argparse's type of a comma-separated list of some of choices."""
    def parse(text):
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"expected {what}s of {', '.join(choices)}, got {text!r}")
        return names
    return parse


def make_parser():
    """The command line's parser; every option shows its default in --help."""
    p = argparse.ArgumentParser(prog="python -m fastln.serve.loadtest",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="4 streams (on 2 multiplexed connections), 20 steps, every run once; "
                        "writes its files only to an --outdir given")
    p.add_argument("--dtypes", nargs="+", type=names_of("dtype", DTYPES), default=list(DTYPES),
                   metavar="DTYPE", help=f"the model's dtypes, of {', '.join(DTYPES)} "
                   f"(int8: the float32 model through fastln.rnn.quantize), separated by "
                   f"spaces or commas")
    p.add_argument("--runs", nargs="+", type=names_of("run", RUNS + CLUSTER_RUNS),
                   default=list(RUNS), metavar="RUN",
                   help=f"the runs, of {', '.join(RUNS)} (the default), and "
                   f"{', '.join(CLUSTER_RUNS)} (which need nginx and redis-server), separated "
                   f"by spaces or commas; only some of them: writes its files only to an "
                   f"--outdir given")
    p.add_argument("--streams", type=int, default=256, help="streams of closed, echo and open")
    p.add_argument("--steps", type=int, default=400, help="steps per stream of closed and echo")
    p.add_argument("--inflight", type=int, default=1,
                   help="frames outstanding per stream (per connection, multiplexed) in the "
                        "closed loops")
    p.add_argument("--connections", type=int, default=8,
                   help="multiplexed connections of mux-closed and mux-open, the streams "
                        "split evenly among them")
    p.add_argument("--hz", type=float, default=40.0, help="frames per second per open stream")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the open-loop run")
    p.add_argument("--sweep-hz", type=float, default=50.0, help="frames per second per "
                   "stream in the sweep")
    p.add_argument("--sweep-streams", type=int, nargs="+",
                   default=[256, 320, 384, 448, 512, 576, 640, 704, 768, 1024, 1536, 2048],
                   help="stream counts of the sweep, tried in order")
    p.add_argument("--sweep-seconds", type=float, default=4.0, help="length of a sweep run")
    p.add_argument("--p99-ms", type=float, default=20.0,
                   help="the sweep stops after the first count whose p99 reaches this")
    p.add_argument("--restart-streams", type=int, default=64, help="streams of the restart run")
    p.add_argument("--restart-steps", type=int, default=400, help="steps per stream of the "
                   "restart run; the server restarts after 40%% of all")
    p.add_argument("--checkpoint", choices=CHECKPOINTS, default="none",
                   help="the server of closed, open, sweep, mux-closed and mux-open "
                        "checkpoints its streams: nowhere, to a directory (--checkpoint-dir), "
                        "or to a redis-server that the run starts (--checkpoint-store); its "
                        "rows' names end in +dir or +redis")
    p.add_argument("--checkpoint-interval", type=float, default=1.0,
                   help="the servers' --checkpoint-interval, with --checkpoint and in the "
                        "cluster runs")
    p.add_argument("--crash-streams", type=int, default=256,
                   help="streams of crash, mux-crash (closed loops) and outage (at --hz)")
    p.add_argument("--crash-steps", type=int, default=400,
                   help="steps per stream of crash, and a quarter of mux-crash's (the kill "
                        "comes after 40%% of all)")
    p.add_argument("--outage", type=float, default=10.0,
                   help="seconds redis-server is down in the outage run")
    p.add_argument("--lease", type=float, default=5.0, help="the cluster's servers' --lease")
    p.add_argument("--nginx-conf", default=default_conf(),
                   help="the nginx configuration of the cluster runs: docs/nginx/fastln.conf "
                        "of the checkout (None outside one)")
    p.add_argument("--input", type=int, default=128, help="the model's input_size I")
    p.add_argument("--hidden", type=int, default=256, help="the model's hidden_size H")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the weights, the inputs and the open-loop phases")
    p.add_argument("--threads", type=int, default=1,
                   help="fastln threads of the server and of the reference run")
    p.add_argument("--max-queue-per-stream", type=int, default=256,
                   help="the server's --max-queue-per-stream")
    p.add_argument("--time-limit", type=float, default=60.0,
                   help="seconds per run at most (after an open loop's schedule)")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds per connection and hello at most")
    p.add_argument("--outdir",
                   help=f"the folder to write {RESULTS} and {FIGURE} to; None: the current "
                        f"folder, for a full run only")
    p.add_argument("--no-write", action="store_true", help=f"write neither {RESULTS} nor {FIGURE}")
    return p


def main(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    # a value given of --dtypes or --runs is a list (of its commas); each name once, in order
    for name in ("dtypes", "runs"):
        values = getattr(args, name)
        setattr(args, name, list(dict.fromkeys(
            v for vs in values for v in (vs if isinstance(vs, list) else [vs]))))
    if args.quick:
        args.streams, args.steps, args.restart_streams, args.restart_steps = 4, 20, 4, 200
        args.seconds, args.sweep_seconds, args.sweep_streams = 0.5, 0.4, [4, 8]
        args.connections, args.crash_streams, args.crash_steps, args.outage = 2, 8, 400, 2.0
        args.checkpoint_interval = 0.1
    if set(args.runs) & set(CLUSTER_RUNS) and not (
            args.nginx_conf and os.path.exists(args.nginx_conf)):
        p.error(f"--runs {' '.join(set(args.runs) & set(CLUSTER_RUNS))} need --nginx-conf, "
                f"docs/nginx/fastln.conf of a checkout (got {args.nginx_conf})")
    counts = (args.streams, args.steps, args.inflight, args.restart_streams, args.restart_steps,
              args.threads, args.max_queue_per_stream, args.input, args.hidden,
              args.connections, args.crash_streams, args.crash_steps, *args.sweep_streams)
    if min(counts) < 1:
        p.error("--streams, --steps, --inflight, --restart-streams, --restart-steps, --threads, "
                "--max-queue-per-stream, --input, --hidden, --connections, --crash-streams, "
                "--crash-steps and --sweep-streams must be at least 1")
    if args.outdir is not None and args.no_write:
        p.error("--outdir names a folder to write to, and --no-write says to write nothing")
    if args.inflight > args.max_queue_per_stream:
        p.error(f"--inflight {args.inflight} is over --max-queue-per-stream "
                f"{args.max_queue_per_stream}: the server would close the streams")
    if not min(args.hz, args.seconds, args.sweep_hz, args.sweep_seconds, args.p99_ms,
               args.time_limit, args.timeout, args.checkpoint_interval, args.outage,
               args.lease) > 0:
        p.error("--hz, --seconds, --sweep-hz, --sweep-seconds, --p99-ms, --time-limit, "
                "--timeout, --checkpoint-interval, --outage and --lease must be above 0")
    fastln.set_num_threads(args.threads)
    # a socket per stream on each side: the server inherits this process's limit
    need = 4 * max(args.streams, args.crash_streams, *args.sweep_streams) + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (
                need if hard == resource.RLIM_INFINITY else min(need, hard), hard))
    command = "python -m fastln.serve.loadtest " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print(table([], header=True), flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        try:
            rows, largest = run_all(args, workdir)
        except (RuntimeError, OSError) as e:   # a server that did not start, or died
            print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return 1
    print()
    print(table(rows))
    for line in ratios(rows):
        print(line)
    if "sweep" in args.runs:
        print(largest_line(largest, args))
    partial = args.quick or set(args.runs) != set(RUNS)
    if args.no_write:
        pass
    elif partial and args.outdir is None:
        print(f"\nnothing written: {'--quick' if args.quick else '--runs ' + ' '.join(args.runs)}"
              f" is a {'smoke test' if args.quick else 'part of a run'}, and {RESULTS} and "
              f"{FIGURE} in the current folder keep a full run's results; --outdir DIR "
              f"writes these to DIR")
    else:
        outdir = args.outdir or "."
        results, figure = (os.path.join(outdir, name) for name in (RESULTS, FIGURE))
        os.makedirs(outdir, exist_ok=True)
        write_results(results, rows, largest, args, command.strip())
        plot(rows, figure)
        print(f"\nwrote {results} and {figure}")
    return 1 if any(r["errors"] or r["mismatches"] or r["lost"] for r in rows) else 0
