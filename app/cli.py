"""What every script shares: turning UserError into a one-line message and exit status 2, and
a start-up and exit without garbage collections over TensorFlow's half a million long-lived
objects (`lasting_imports`, and the freeze in `run_cli`)."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ start-up chatter out of the CLI
# ... and its Python INFO lines out of the scripts' INFO logs (they reach them through the root
# logger), through its own logger or absl's: one per checkpoint written ("Sharding callback
# duration: ..."). Warnings still show.
for _name in ("tensorflow", "absl"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def run_cli(main: Callable[[], int | None]) -> None:
    """Run a script's main(); bad input exits 2 with `error: ...` on stderr instead of a traceback."""
    from app.errors import UserError

    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 is printed escaped, not a crash
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        sys.exit(main() or 0)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        # Python's last garbage collections at exit walk every object TensorFlow and Keras made;
        # frozen, they are skipped. The process is ending; atexit handlers still run.
        gc.freeze()


@contextlib.contextmanager
def lasting_imports() -> Iterator[None]:
    """Around a script's imports of TensorFlow and the app: no garbage collection while they
    load, and what they made frozen after. Importing TensorFlow makes ~400k objects that live
    until exit and almost no garbage, yet Python's full collections walked them several times
    during the import and again at every later one. Keras comes first, without scikit-learn
    (`_import_keras`)."""
    gc.disable()
    try:
        _import_keras()
        yield
    finally:
        gc.freeze()
        gc.enable()


def _import_keras() -> None:
    """Keras imports scikit-learn for its scikit-learn wrappers whenever it is installed (0.3-0.6
    s of every start); no script uses those wrappers. While Keras loads, `import sklearn` fails
    (a None in sys.modules), so the wrappers go without it; the app's own uses of scikit-learn
    (the audit, multi-label metrics) import it afterwards as usual."""
    blocked = "sklearn" not in sys.modules
    if blocked:
        sys.modules["sklearn"] = None  # type: ignore[assignment]
    try:
        import keras  # noqa: F401
    finally:
        if blocked:
            del sys.modules["sklearn"]


def add_export_run_flags(parser) -> None:
    """MODEL_DIR, --batch-size and --runtime: what the commands that run an export over photo
    files (predict, review) take, spelled once."""
    parser.add_argument("model_dir", type=Path, help="run dir, EXPORT_DIR/<name>, or EXPORT_DIR/<name>/<version>")
    parser.add_argument("--batch-size", type=int, default=32, help="photos per model call (default 32)")
    add_runtime_flag(parser)


RUNTIME_CHOICES = ("auto", "tf", "litert", "openvino", "onnx")  # here, not beside the runtimes: --help imports no TF


def add_runtime_flag(parser) -> None:
    """--runtime, as every command that runs an export takes it."""
    parser.add_argument(
        "--runtime",
        choices=RUNTIME_CHOICES,
        default="auto",
        help="auto: the fastest, timed on a batch as it loads, of TensorFlow (the SavedModel, as TF Serving runs"
        " it) and the export's LiteRT file, OpenVINO IR and ONNX file whose parity checks passed; tf, litert,"
        " openvino, onnx: that one (default auto)",
    )


def add_weights_and_seeds(parser) -> None:
    """The --weights and --seeds flags every accuracy benchmark takes, spelled once."""
    parser.add_argument(
        "--weights", default="auto", help="backbone weights: auto | imagenet | none | PATH (default auto)"
    )
    parser.add_argument("--seeds", type=int_list, default=(0, 1, 2), help="seeds, comma-separated (default 0,1,2)")


def int_list(text: str) -> tuple[int, ...]:
    """argparse type for '0,1,2' (the benchmarks' seeds and sizes); a bad item is argparse's usage error."""
    return tuple(int(v) for v in text.split(","))


def finite_float(text: str) -> float:
    """argparse type for every number flag: nan and inf are argparse's usage error naming the flag,
    as no limit, fraction or rate means them (inf reached int() as an OverflowError's traceback,
    and nan passes every `value > 0` check as false, or a bound check as true)."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"'{text}' is not a finite number")
    return value


def tcp_port(text: str) -> int:
    """argparse type for --port: a TCP port number, 0 to 65535 (0: any free one); else argparse's
    usage error naming the flag, instead of the socket's traceback once the model has loaded."""
    import argparse

    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0 to 65535)")
    return port


def host_and_port(text: str) -> str:
    """argparse type for an address given as HOST:PORT, its port checked as --port's is."""
    import argparse

    host, _, port = text.rpartition(":")
    if not host:
        raise argparse.ArgumentTypeError(f"'{text}' is not HOST:PORT")
    tcp_port(port)
    return text
