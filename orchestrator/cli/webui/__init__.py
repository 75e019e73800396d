"""The read-only web UI (`corral ui`, and inside `corral up`): the CLI's projections served to a browser.

One live projection per process (`live.py`: the log followed once, as `corral top` does), fanned out to
every browser as server-sent events. `server.py` holds the routes, `access.py` who may read them,
`queries.py` how a query is read; the pages' JSON is built by `payloads.py` from the views the CLI prints
(orchestrator/cli/views.py, timeline.py) and by `history.py` from the index's answers. The front end is
plain files in `static/`, shipped in the wheel: no build step, nothing fetched from the internet.
"""
