"""Error types: `RecordError`, the one that sends a record to quarantine, and `ConfigurationError`."""


class ConfigurationError(ValueError):
    """A setting (an environment variable, a key, a resource value) is missing or wrong: the operator fixes it.

    The command line prints it as one line of error, exit status 1.
    """


class RecordError(ValueError):
    """A record cannot be used; the message is the quarantine reason.

    Reasons name fields and rules, never field values, because values may be
    personal data and quarantine reasons are read by operators.
    """


#: Deepest nesting of arrays and objects a record may have (the record itself is level 1). Canonicalising and
#: hashing recurse per level, and so does orjson (which stops at 254); real listings nest a handful of levels.
MAX_NESTING = 100
NESTING_TOO_DEEP = f"nesting too deep (more than {MAX_NESTING} levels of arrays and objects)"
