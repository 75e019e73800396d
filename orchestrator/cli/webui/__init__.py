"""The read-only web UI (`corral ui`, and inside `corral up`): the CLI's projections served to a browser.

One live projection per process (`live.py`: the log followed once, as `corral top` does), fanned out to
every browser as server-sent events (`server.py`); the pages' JSON is built by `payloads.py` from the
same views the CLI prints (orchestrator/cli/views.py, timeline.py, the index's answers). The front end is
plain files in `static/`, shipped in the wheel: no build step, nothing fetched from the internet.
"""
