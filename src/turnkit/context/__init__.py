"""What a turn sends to the model: the transcript, the prefix rule and its two exceptions.

- `turnkit.context.transcript`: messages as plain JSON, kept exactly as sent.
- `turnkit.context.prefix`: every request starts with the previous request's messages.
- `turnkit.context.compaction`: history becomes a summary at 85% of the context window.
- `turnkit.context.pictures`: pictures in old tool results are released past twenty.
- `turnkit.context.results`: argument repair and long-result previews.
"""
