"""The comparison report as HTML pages: one experiment's report, several experiments compared, and the list of
experiments (`/`) a browser starts from. The pages are built by hpo.report from the database on each request;
they are self-contained (figures embedded), so they load nothing else."""

from __future__ import annotations

import shlex
import threading
from collections import OrderedDict
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse

from hpo.errors import HpoError
from hpo.storage.base import ExperimentStatus
from hpo.storage.engine import safe_url
from server.deps import ExperimentDep, SettingsDep, StorageDep
from server.errors import JSON_ERROR_RESPONSES
from server.schemas import NAME_PATTERN

API_PREFIX = "/api/v1"  # as in server.app (which imports this module)
MAX_COMPARED = 20
CACHED_PAGES = 16
HTML = {"content": {"text/html": {}}, "description": "A self-contained HTML page."}

router = APIRouter(tags=["reports"], responses=JSON_ERROR_RESPONSES)
home = APIRouter()


def report_path(name: str) -> str:
    return f"{API_PREFIX}/experiments/{quote(name)}/report"


def hpo_command(database_url: str) -> str:
    """`hpo --db URL`: the page's commands (export a best config) then read the server's database, not whatever
    database the reader's shell defaults to (the password stays hidden: the reader supplies it)."""
    return f"hpo --db {shlex.quote(safe_url(database_url))}"


class _PageCache:
    """Reports of experiments that no controller drives any more: their trials, and so their pages, only change
    when a resume runs more trials, which changes the key (status and trial counts), or when `hpo webui` reopens
    the NNI web UI on another port (the key holds its addresses)."""

    def __init__(self) -> None:
        self._pages: OrderedDict[tuple, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> str | None:
        with self._lock:
            return self._pages.get(key)

    def put(self, key: tuple, page: str) -> None:
        with self._lock:
            self._pages[key] = page
            while len(self._pages) > CACHED_PAGES:
                self._pages.popitem(last=False)


_cache = _PageCache()


@router.get("/experiments/{name}/report", response_class=HTMLResponse, responses={200: HTML})
def experiment_report(record: ExperimentDep, storage: StorageDep, settings: SettingsDep):
    """The experiment's comparison report: verdict, best so far, learning curves, samples to target, noise scale,
    hyperparameter effects and importance, and the best config per arm with its export command."""
    from hpo.report.html import experiment_report as build  # matplotlib: loaded by the first report, not at start-up

    key = None
    if record.status is not ExperimentStatus.RUNNING:
        counts = storage.count_trials_by_state(record.id)
        webui = tuple(str(link.get("url")) for link in record.nni_webui)  # `hpo webui` may reopen it elsewhere
        key = (id(storage), record.id, record.status, tuple(sorted((s.value, n) for s, n in counts.items())), webui)
        page = _cache.get(key)
        if page is not None:
            return HTMLResponse(page)
    page = build(storage, record.name, hpo_command=hpo_command(settings.database_url), index="/")
    if key is not None:
        _cache.put(key, page)
    return HTMLResponse(page)


NOTHING_TO_COMPARE = {  # the 422 of a form sent with nothing ticked is a page; other 422s stay JSON
    422: {**JSON_ERROR_RESPONSES[422], "content": {**JSON_ERROR_RESPONSES[422]["content"], "text/html": {}}}
}


@router.get("/reports/compare", response_class=HTMLResponse, responses={200: HTML, **NOTHING_TO_COMPARE})
def compare_report(
    storage: StorageDep,
    name: Annotated[
        list[str] | None,
        Query(max_length=MAX_COMPARED, description="The experiments to compare (repeat the parameter)."),
    ] = None,
):
    """Several experiments: samples to target and the measured noise scale against global batch size."""
    from hpo.report.html import comparison_report  # matplotlib: loaded by the first report, not at start-up
    from hpo.report.markup import page

    if not name:  # the index page's form sent with nothing ticked: a page that says so, for the browser it came from
        body = ("<h1>Nothing to compare</h1><p>Tick one or more experiments on <a href='/'>the list of experiments</a>"
                ", then compare them (or give <code>?name=A&amp;name=B</code>).</p>")  # fmt: skip
        return HTMLResponse(page("nothing to compare", body), status_code=422)
    bad = [n for n in name if not _is_name(n)]
    if bad:
        raise HpoError(f"name {bad[0]!r} is not an experiment name (lowercase letters, digits, '-' and '_')")
    for n in name:
        storage.get_experiment_by_name(n)  # a missing one is a 404 before any work
    return HTMLResponse(comparison_report(storage, list(dict.fromkeys(name)), link=report_path, index="/"))


def _is_name(text: str) -> bool:
    import re

    return re.fullmatch(NAME_PATTERN, text) is not None


@home.get("/", response_class=HTMLResponse, include_in_schema=False)
def index(storage: StorageDep):
    """Every experiment with a link to its report, and a form to compare several."""
    from hpo.report.html import index_page  # matplotlib: loaded by the first report, not at start-up

    return HTMLResponse(index_page(storage, link=report_path, compare_action=f"{API_PREFIX}/reports/compare"))
