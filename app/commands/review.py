"""Label the unlabelled photos that would help the model most, on a local page.

    photoclf review runs/photos ~/new_photos                      # http://127.0.0.1:8502/
    photoclf review runs/photos ~/new_photos --manifest data/more.csv
    photoclf review runs/photos ~/new_photos --top 20             # print the queue, serve nothing

Every photo goes through the model once. Those it is least sure of come first (the smallest
margin between its top two classes, or --by entropy; a photo it calls "none of these" counts as
the least sure), and of a burst of near-identical photos only one comes early. The page shows
them in batches with the model's guess: Enter accepts it, 1-9 or the list pick another class,
S skips, N says "not any class", U undoes, all by keyboard or mouse. Each answer is added to the
manifest at once (path,label[,split],keep; a temp file renamed): `photoclf convert MANIFEST OUT`
reads it, leaving out "not any class" photos. A new manifest starts with the run's own photos in
their splits (--source, else where its dataset.json says they are), and the finished page prints
the commands that convert it and train again from the run. Photos the manifest already holds are
not asked again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli import add_export_run_flags, lasting_imports, tcp_port
from app.data.photo_lists import list_inputs
from app.errors import UserError
from app.export.layout import resolve_model_dir
from app.net import check_bindable
from app.review import loop
from app.review.answers import Answers
from app.review.model import check_reviewable
from app.run_dir import RunDir

SHOW_FAILED = 10  # files listed as unreadable; the rest are counted

HELP = "label the unlabelled photos that would help the model most, on a local page"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_export_run_flags(p)
    p.add_argument(
        "unlabelled", help="folder of photos (searched recursively), glob, .txt/.csv list of paths, or one photo"
    )
    p.add_argument(
        "--manifest",
        type=Path,
        default=Path("review.csv"),
        help="CSV the answers are added to; an existing manifest keeps its columns (default review.csv)",
    )
    p.add_argument(
        "--source",
        type=Path,
        default=None,
        help="the photos the run was trained on (class folders or manifest; default: the one its dataset.json names):"
        " a new --manifest starts with them, each in its split, so converting it adds the answers to them",
    )
    p.add_argument("--by", choices=["margin", "entropy"], default="margin", help="uncertainty measure (default margin)")
    p.add_argument("--top", type=int, default=0, help="print the first N of the queue and exit, serving nothing")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=tcp_port, default=8502, help="port (default 8502)")


def run(args: argparse.Namespace) -> None:
    for flag, value, least in (("--top", args.top, 0), ("--batch-size", args.batch_size, 1)):
        if value < least:
            raise UserError(f"{flag} must be >= {least}, got {value}")
    version = resolve_model_dir(args.model_dir)
    if not args.top:
        check_bindable(args.host, args.port)
    check_reviewable(version)
    listed = list_inputs(args.unlabelled, "UNLABELLED", "review ranks photos not labelled yet")
    run_dir = RunDir.of_export(version)
    answers = _answers(args, run_dir)
    reviewed = answers.reviewed()
    photos = [p for p in listed if p.resolve() not in reviewed]
    copies = answers.copies(photos)
    photos = [p for p in photos if p not in copies]
    if not photos:
        raise UserError(f"{args.unlabelled}: every photo is already in {args.manifest}; nothing to review")
    known = len(listed) - len(photos)
    print(
        f"ranking {len(photos)} photo(s)"
        + (f"; {known} left out as {args.manifest} names them already (answered, or the run's own)" if known else "")
        + (f", {len(copies)} of them copies under another path" if copies else "")
    )
    _review(args, version, answers, photos, loop.next_steps(answers, run_dir))


def _answers(args: argparse.Namespace, run_dir: RunDir | None) -> Answers:
    """The manifest: an existing one as it is (one the converter would refuse is said here); a
    new one starts with the run's photos where their source is known."""
    answers = Answers.open(args.manifest)
    if args.manifest.exists() or run_dir is None:
        return answers
    source = loop.source_of(run_dir, args.source)
    if source is None:
        print(f"{args.manifest} holds the answers only (the run's photos are not found: --source names them)")
        return answers
    with lasting_imports():
        answers = loop.start_combined(args.manifest, run_dir, source)
    if not args.top:  # --top writes nothing; the run's own photos are still not asked about
        print(f"{args.manifest} will hold the run's {len(answers.rows)} photos from {source} (each in its split) "
              "and the answers")  # fmt: skip
    return answers


def _review(
    args: argparse.Namespace, version: Path, answers: Answers, photos: list[Path], next_steps: list[str]
) -> None:
    with lasting_imports():
        from app.review.queue import rank_photos

    queue = rank_photos(version, photos, runtime=args.runtime, method=args.by, batch_size=args.batch_size)
    if not queue.candidates:
        raise UserError(f"UNLABELLED {args.unlabelled}: none of its {len(photos)} file(s) is a photo the model reads")
    for row in queue.failed[:SHOW_FAILED]:
        print(f"  not a photo the model reads: {row['path']}: {row['error']}")
    if len(queue.failed) > SHOW_FAILED:
        print(f"  ... and {len(queue.failed) - SHOW_FAILED} more")
    if args.top:
        for candidate in queue.candidates[: args.top]:
            guesses = ", ".join(f"{label} {score:.2f}" for label, score in candidate.guesses)
            flag = " (none of these)" if candidate.unknown else ""
            print(f"{candidate.priority:.3f}  {candidate.path}  {guesses}{flag}")
        return
    _serve(args, queue, answers, next_steps)


def _serve(args: argparse.Namespace, queue, answers: Answers, next_steps: list[str]) -> None:
    from app.review.server import Review, make_app
    from app.serving.connections import serve

    root = Path(args.unlabelled) if Path(args.unlabelled).is_dir() else Path.cwd()
    review = Review(queue, answers, root, next_steps=next_steps)
    serve(
        make_app(review),
        args.host,
        args.port,
        max_connections=64,
        client_timeout=20.0,
        on_started=lambda: print(
            f"{len(queue.candidates)} photo(s) to review at http://{args.host}:{args.port}/;"
            f" answers go to {answers.path} (Ctrl-C to stop)",
            flush=True,
        ),
    )
    print(f"{review.answered} answered, {review.skipped} skipped → {answers.path}")
    if review.next_steps:
        print("to add them to the run's photos and train again:\n" + "\n".join(f"  {c}" for c in review.next_steps))
    else:
        print("to train on them, add them to your photos (a manifest: --manifest YOURS.csv; folders: --source)")
