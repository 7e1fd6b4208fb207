"""Coverage-guided fuzzing (atheris, libFuzzer) of every parser of untrusted bytes.

    python -m fuzz --list                      # the targets
    python -m fuzz image_header --seconds 600  # executions, crashes, hangs, peak memory

A crash is any exception other than the documented ones (a UserError, the server's 4xx errors,
the converter's skip reasons), one input taking over 1 s, or memory growing over 200 MB. Each
target writes its own seed corpus (small images of every format, valid requests, manifests and
metadata files); nothing found is kept in the repository but the regression tests built from it.
"""
