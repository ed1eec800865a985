"""The one error type that sends a record to quarantine."""


class RecordError(ValueError):
    """A record cannot be used; the message is the quarantine reason.

    Reasons name fields and rules, never field values, because values may be
    personal data and quarantine reasons are read by operators.
    """
