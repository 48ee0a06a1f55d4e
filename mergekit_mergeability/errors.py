"""The one exception type for user errors: the CLI prints it as one line, no traceback."""


class UserError(ValueError):
    """Bad input the user can fix; the message names the file, model, tensor or field."""
