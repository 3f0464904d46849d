"""The project's file-backed great-expectations context: a Checkpoint per gate, stored results, Data Docs.

Where: ``<lake>[/<namespace>]/gx/`` (:meth:`mjoin.lake.layout.Lake.gx`), a GX 1.x ``FileDataContext`` a GX
user opens with ``gx.get_context(mode="file", context_root_dir=...)``: ``expectations/`` (the suites of
:mod:`mjoin.gates.suites`), ``validation_definitions/``, ``checkpoints/``, ``uncommitted/validations/`` (the
stored results) and ``uncommitted/data_docs/local_site/`` (the Data Docs site).

Per gate and query one Checkpoint ``mjoin.<gate>.<query>`` over one ValidationDefinition per summary frame
(its suite and a DataFrameAsset of the pandas data source ``mjoin``), with GX's ``UpdateDataDocsAction``.
A gate validates its frames as on the fast path (:mod:`mjoin.gates.gxengine`: GX's Validator, as
``ValidationDefinition.run`` calls it); :meth:`GXProject.record` then does what ``Checkpoint.run`` does with
the results: stamps them with the checkpoint's and definitions' ids and one run id, stores them, builds the
``CheckpointResult`` and runs the checkpoint's actions (the Data Docs pages of those results and the index;
by default of the failed ones only: ``GateConfig.results_docs``).
``Checkpoint.run`` itself cannot validate a gate: it hands the same ``batch_parameters`` to every definition,
and each frame of a gate is another DataFrame.

A missing context is created; one that cannot be read (a broken ``great_expectations.yml``, a truncated
store file) is moved aside to ``gx.broken-<time>`` and recreated, with a WARNING naming both; if even that
fails the gate's verdict stands and the result says why nothing was stored (never a failed run).
Concurrent runs (a scheduled and a drift-triggered run, the CLI) take a file lock for the write.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import time
import urllib.parse

from jinja2 import FileSystemBytecodeCache

from mjoin.gates.gxengine import RESULT_FORMAT, runner
from mjoin.model.timeutil import iso

log = logging.getLogger("mjoin.gates")

#: the Data Docs site every checkpoint's action rebuilds
SITE = "local_site"
#: validation results the Data Docs index lists (newest first): every action rebuilds the index, and GX reads
#: each result it lists
INDEX_LIMIT = 30
SOURCE = "mjoin"
#: what this project registered in the context (see GXProject._definition)
INDEX = "mjoin_registered.json"
#: Data Docs load Bootstrap from public CDNs; on a machine without internet the pages stay readable with this
DATA_DOCS_CSS = ("body{font-family:sans-serif;margin:1em 1.5em;font-size:14px}"
                 "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px}"
                 ".text-danger,.alert-danger{color:#b00020}.text-success{color:#1b5e20}\n")
#: how often (seconds) stored results older than ``results_keep_days`` are removed (the marker file's mtime)
PRUNE_EVERY = 3600.0
PRUNED = ".mjoin_pruned"


class GXProject:
    """The file-backed GX context at ``root`` (made or repaired on first use), its checkpoints and results."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self._context = None
        self._registered: dict = {}  # suite name -> (the suite object of mjoin.gates.suites, its definition's id)

    # ---- the context ----------------------------------------------------------------------
    @property
    def site_dir(self) -> str:
        return os.path.join(self.root, "uncommitted", "data_docs", SITE)

    @property
    def context(self):
        if self._context is None:
            self._context = self._open()
        return self._context

    def _open(self):
        created = not os.path.exists(os.path.join(self.root, "great_expectations.yml"))
        try:
            ctx = self._load()
        except Exception as exc:  # any unreadable part of the context: repair, never fail the gate
            ctx = self._recreate(exc)
        else:
            if created:
                log.info("GX context created at %s (Data Docs: %s)", self.root, os.path.join(self.site_dir, "index.html"))
        return ctx

    def _load(self):
        import great_expectations as gx
        from great_expectations.data_context.data_context.context_factory import project_manager

        _cache_templates(os.path.join(self.root, "uncommitted", "jinja_cache"))
        fast = runner().context  # get_context makes the file context the process's current GX project ...
        os.makedirs(self.root, exist_ok=True)
        ctx = gx.get_context(mode="file", context_root_dir=self.root)
        project_manager.set_project(fast)  # ... the fast path's suites stay bound to the ephemeral one
        sites = ctx.variables.data_docs_sites or {}
        site = {"class_name": "SiteBuilder", "show_how_to_buttons": False,
                "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                                  "base_directory": f"uncommitted/data_docs/{SITE}/"},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder",
                                       "validation_results_limit": INDEX_LIMIT}}
        if sites != {SITE: site}:
            ctx.variables.data_docs_sites = {SITE: site}
            ctx.variables.save()
            ctx = gx.get_context(mode="file", context_root_dir=self.root)
            project_manager.set_project(fast)
        try:
            ctx.data_sources.get(SOURCE)
        except (KeyError, ValueError, LookupError):
            ctx.data_sources.add_pandas(SOURCE)
        styles = os.path.join(self.root, "plugins", "custom_data_docs", "styles")
        if not os.path.exists(os.path.join(styles, "data_docs_custom_styles.css")):
            os.makedirs(styles, exist_ok=True)  # GX inlines this file into every page it renders
            with open(os.path.join(styles, "data_docs_custom_styles.css"), "w") as fh:
                fh.write(DATA_DOCS_CSS)
        return ctx

    def _recreate(self, exc: BaseException):
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        moved = f"{self.root}.broken-{stamp}"
        if os.path.exists(self.root):
            shutil.move(self.root, moved)
            log.warning("the GX context at %s could not be read (%s: %s): moved to %s, a new one is created",
                        self.root, type(exc).__name__, _first_line(exc), moved)
        else:
            log.warning("the GX context at %s could not be made (%s: %s): trying once more", self.root,
                        type(exc).__name__, _first_line(exc))
        self._forget()
        ctx = self._load()
        log.info("GX context recreated at %s", self.root)
        return ctx

    # ---- suites, definitions, checkpoints ---------------------------------------------------
    # Registering through GX costs ~0.3 s a suite in a new process (GX re-reads great_expectations.yml for each
    # store operation), and every Airflow task is a new process: INDEX records what was registered (each suite's
    # fingerprint, its definition's id, each checkpoint's id and definitions), so an unchanged suite is not
    # registered again.
    def _index(self) -> dict:
        path = os.path.join(self.root, INDEX)
        try:
            with open(path) as fh:
                doc = json.load(fh)
            return doc if isinstance(doc, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save_index(self, index: dict) -> None:
        path = os.path.join(self.root, INDEX)
        with open(path + ".tmp", "w") as fh:
            json.dump(index, fh, indent=1, sort_keys=True)
        os.replace(path + ".tmp", path)

    def _definition(self, suite, index: dict) -> tuple[str, str, bool]:
        """``(name, validation definition id, registered now)`` of ``suite`` here; registered (suite, asset,
        definition) only when the suite differs from what the index says was registered."""
        known = self._registered.get(suite.name)
        if known is not None and known[0] is suite:
            return suite.name, known[1], False
        sha = _fingerprint(suite)
        entry = (index.get("suites") or {}).get(suite.name) or {}
        if entry.get("sha") == sha and entry.get("validation_id"):
            self._registered[suite.name] = (suite, entry["validation_id"])
            return suite.name, entry["validation_id"], False
        import great_expectations as gx

        ctx = self.context
        stored = ctx.suites.add_or_update(gx.ExpectationSuite(  # copies: the fast path's context owns the originals
            name=suite.name, expectations=[e.copy(update={"id": None}, deep=True) for e in suite.expectations]))
        source = ctx.data_sources.get(SOURCE)
        try:
            asset = source.get_asset(suite.name)
        except LookupError:
            asset = source.add_dataframe_asset(suite.name)
        try:
            batch = asset.get_batch_definition("whole")
        except KeyError:
            batch = asset.add_batch_definition_whole_dataframe("whole")
        vd = ctx.validation_definitions.add_or_update(gx.ValidationDefinition(name=suite.name, data=batch, suite=stored))
        index.setdefault("suites", {})[suite.name] = {"sha": sha, "validation_id": vd.id}
        self._registered[suite.name] = (suite, vd.id)
        return suite.name, vd.id, True

    def checkpoint(self, gate: str, query_name: str, names: list, changed: bool, index: dict) -> tuple[str, str]:
        """``(name, id)`` of the Checkpoint ``mjoin.<gate>.<query>`` over every definition it had and ``names``,
        with one action; written through GX when it is new, lacks one of ``names`` or a definition changed."""
        import great_expectations as gx
        from great_expectations.checkpoint.actions import UpdateDataDocsAction

        name = f"mjoin.{gate}.{query_name}"
        entry = (index.get("checkpoints") or {}).get(name) or {}
        if entry.get("id") and not changed and set(names) <= set(entry.get("definitions") or ()):
            return name, entry["id"]
        ctx = self.context
        merged = sorted(set(names) | set(entry.get("definitions") or ()))
        definitions = []
        for n in merged:
            try:
                definitions.append(ctx.validation_definitions.get(n))
            except Exception:  # a definition that is gone: the checkpoint keeps the ones that exist
                if n in names:
                    raise
        cp = ctx.checkpoints.add_or_update(gx.Checkpoint(
            name=name, validation_definitions=definitions,
            actions=[UpdateDataDocsAction(name="update_data_docs", site_names=[SITE])], result_format=RESULT_FORMAT))
        index.setdefault("checkpoints", {})[name] = {"id": cp.id, "definitions": [d.name for d in definitions]}
        return name, cp.id

    # ---- a gate run --------------------------------------------------------------------------
    def record(self, gate: str, query_name: str, validated: list, run_name: str = "", keep_days: float = 0.0,
               docs: str = "failures") -> dict:
        """Store the results ``validated`` (``[(suite, GX result)]``) of one gate run as a run of the gate's
        Checkpoint and run its actions on them (Data Docs: ``docs`` = ``failures``, the failed validations only;
        ``all``; ``off``); what was stored and where its pages are."""
        from great_expectations.exceptions import GreatExpectationsError

        with self._lock():
            if self._context is not None and not os.path.exists(os.path.join(self.root, "great_expectations.yml")):
                log.warning("the GX context at %s is gone: a new one is created", self.root)
                self._forget()
            try:
                return self._record(gate, query_name, validated, run_name, keep_days, docs)
            except (GreatExpectationsError, ValueError, OSError) as exc:  # a store file GX cannot read: repair once
                self._recreate(exc)
                return self._record(gate, query_name, validated, run_name, keep_days, docs)

    def _forget(self) -> None:
        self._registered.clear()
        self._context = None

    def _record(self, gate, query_name, validated, run_name, keep_days, docs) -> dict:
        from great_expectations.checkpoint.checkpoint import CheckpointResult
        from great_expectations.core.run_identifier import RunIdentifier
        from great_expectations.data_context.types.resource_identifiers import (ExpectationSuiteIdentifier,
                                                                                ValidationResultIdentifier)

        ctx = self.context
        t0 = time.perf_counter()
        index = self._index()
        definitions = [self._definition(suite, index) for suite, _ in validated]
        cp_name, cp_id = self.checkpoint(gate, query_name, [d[0] for d in definitions], any(d[2] for d in definitions),
                                         index)
        self._save_index(index)
        run_id = RunIdentifier(run_name=run_name or None, run_time=datetime.datetime.now(datetime.timezone.utc))
        results = {}
        for (suite, res), (_, vd_id, _) in zip(validated, definitions):
            res.meta.update(validation_id=vd_id, checkpoint_id=cp_id, run_id=run_id, validation_time=run_id.run_time)
            key = ValidationResultIdentifier(expectation_suite_identifier=ExpectationSuiteIdentifier(name=suite.name),
                                             run_id=run_id, batch_identifier=res.batch_id)
            ctx.validation_results_store.set(key, res)
            results[key] = res
        t1 = time.perf_counter()
        if keep_days:
            self.prune(keep_days)
        # Checkpoint.run's last step, on these results: its actions, in its order (UpdateDataDocsAction first);
        # by default on the failed validations only (a page is ~0.3 s; a healthy run renders none)
        shown = {} if docs == "off" else results if docs == "all" else {k: r for k, r in results.items() if not r.success}
        if shown:
            try:
                cp = ctx.checkpoints.get(cp_name)
            except Exception as exc:  # its file broken under us: written again from the definitions
                log.warning("the checkpoint %s in %s could not be read (%s: %s): written again", cp_name, self.root,
                            type(exc).__name__, _first_line(exc))
                # GX's add_or_update reads the stored file first (and fails on it again): the broken file goes
                # first, so the context and its stored results stay
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.root, "checkpoints", f"{cp_name}.json"))
                self.checkpoint(gate, query_name, [d[0] for d in definitions], True, index)
                self._save_index(index)
                cp = ctx.checkpoints.get(cp_name)
            cp._run_actions(CheckpointResult(run_id=run_id, run_results=shown, checkpoint_config=cp))
        t2 = time.perf_counter()
        pages = {key.expectation_suite_identifier.name: self.page_of(key) for key in shown}
        return {"checkpoint": cp_name, "context": self.root, "site": self.site_dir, "index": "index.html",
                "run_name": run_id.run_name, "run_time": iso(run_id.run_time),
                "success": all(r.success for r in results.values()), "stored": len(results), "pages": pages,
                "seconds": {"store": round(t1 - t0, 4), "data_docs": round(t2 - t1, 4)}}

    def page_of(self, key) -> str:
        """The Data Docs page of a stored validation result, relative to the site folder."""
        for site in self.context.get_docs_sites_urls(resource_identifier=key, site_names=[SITE]):
            url = site.get("site_url") or ""
            path = urllib.parse.unquote(urllib.parse.urlparse(url).path)
            if path.startswith(self.site_dir):
                return os.path.relpath(path, self.site_dir)
        return "index.html"

    def prune(self, keep_days: float, now: float | None = None) -> int:
        """Remove stored results older than ``keep_days``, at most once per PRUNE_EVERY per context (a marker
        file: every Airflow task is a new process, and listing the store costs ~1 ms a result); the next Data
        Docs build drops their pages (GX removes a page whose result is gone). The number removed."""
        now = time.time() if now is None else now
        marker = os.path.join(self.root, "uncommitted", PRUNED)
        try:
            last = os.path.getmtime(marker)
        except OSError:
            last = -math.inf
        if now - last < PRUNE_EVERY and now >= last:
            return 0
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open(marker, "w") as fh:
            fh.write(iso(now))
        os.utime(marker, (now, now))
        store = self.context.validation_results_store
        cutoff = datetime.datetime.fromtimestamp(now - keep_days * 86400, datetime.timezone.utc)
        removed = 0
        for key in store.list_keys():
            run_time = getattr(getattr(key, "run_id", None), "run_time", None)
            if run_time is not None and run_time.tzinfo is None:
                run_time = run_time.replace(tzinfo=datetime.timezone.utc)
            if run_time is not None and run_time < cutoff:
                store.remove_key(key)
                removed += 1
        if removed:
            log.info("removed %d stored validation result(s) older than %g days from %s", removed, keep_days, self.root)
        return removed

    @contextlib.contextmanager
    def _lock(self):
        os.makedirs(os.path.dirname(self.root), exist_ok=True)
        with open(f"{self.root}.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


_templates = None  # the jinja2 bytecode cache every Data Docs view of the process uses


def _cache_templates(folder: str) -> None:
    """Let GX's Data Docs views load their Jinja templates compiled (jinja2's FileSystemBytecodeCache).

    GX makes a new Jinja environment for every page it renders and compiles each of its ~50 templates
    again: ~1 s of the ~1.2 s an ``UpdateDataDocsAction`` took per validation result (cProfile; 0.25 s with
    the cache, bench/gates/README.md). The cache is keyed by the template's source, so a new GX version
    compiles afresh."""
    global _templates
    from great_expectations.render.view.view import DefaultJinjaView

    os.makedirs(folder, exist_ok=True)
    _templates = FileSystemBytecodeCache(folder)
    init = DefaultJinjaView.__init__
    if getattr(init, "_mjoin_cached", False):
        return

    def cached_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if _templates is not None:
            self.env.bytecode_cache = _templates

    cached_init._mjoin_cached = True
    DefaultJinjaView.__init__ = cached_init


def _fingerprint(suite) -> str:
    """The suite's expectations as configured (type, kwargs, meta, notes, severity, description), hashed."""
    docs = [e.configuration.to_json_dict() for e in suite.expectations]
    for d in docs:
        d.pop("id", None)
    return hashlib.sha1(json.dumps([suite.name, docs], sort_keys=True, default=str).encode()).hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


_projects: dict = {}


def project(root: str) -> GXProject:
    """The process's GXProject of ``root`` (one per folder, so suites are registered once per process)."""
    root = os.path.abspath(root)
    if root not in _projects:
        _projects[root] = GXProject(root)
    return _projects[root]
