"""The one exception type that reaches users as a one-line message instead of a traceback."""


class UserError(Exception):
    """Bad input from the user (a path, a flag, a dataset). Scripts print it and exit 2."""
