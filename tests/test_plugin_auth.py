"""The plugin's pages behind Airflow's login, over real HTTP against a running api-server (SQLite home):
no user -> 401 (a browser -> the login page), a JWT from /auth/token or the UI's cookie -> 200, and a
report `query` that is not a known query (`..` above all) -> 404, never a file elsewhere in the lake."""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest

from airflow_helpers import make_env, services
from mjoin.loop.airflow_env import admin_password
from mjoin.lake.layout import Lake

pytestmark = [pytest.mark.airflow, pytest.mark.slow]
QUERY = "tpcds_returns_by_address"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _get(port: int, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    opener = urllib.request.build_opener(_NoRedirect)
    req = urllib.request.Request(f"http://localhost:{port}{path}", headers=headers or {})
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _token(port: int, env: dict) -> str:
    req = urllib.request.Request(f"http://localhost:{port}/auth/token", method="POST",
                                 data=json.dumps({"username": "admin", "password": admin_password(env)}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["access_token"]


def test_plugin_needs_a_logged_in_user_and_serves_only_report_files(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    report_dir = lake.reports(QUERY)
    os.makedirs(report_dir)
    with open(os.path.join(report_dir, "index.html"), "w") as f:
        f.write("<html>the evaluation report</html>")
    raw = lake.stream_file("customer", 1767225600)  # what `..` reached before: a landed stream file
    os.makedirs(os.path.dirname(raw))
    with open(raw, "wb") as f:
        f.write(b"PAR1 raw stream bytes")
    evaluation = os.path.join(Lake(lake.root, "eval/evaluate").reports(QUERY), "evaluation")
    os.makedirs(evaluation)
    with open(os.path.join(evaluation, "index.html"), "w") as f:
        f.write("<html>an evaluation namespace's report</html>")
    secret = os.path.join(lake.root, "secret.txt")
    with open(secret, "w") as f:
        f.write("not a report")
    env = make_env(tmp_path / "airflow", lake.root, period_minutes=5)
    with services(env, tmp_path, components=("api-server",)) as (senv, port):
        # no user: 401 for the API, the login page for a browser
        for path in ("/mjoin/", "/mjoin/api/plans", f"/mjoin/reports/{QUERY}/index.html"):
            status, _, body = _get(port, path)
            assert status == 401, (path, status, body[:200])
        status, headers, _ = _get(port, "/mjoin/", {"Accept": "text/html"})
        assert status == 303 and "/auth/" in headers["location"] and "login" in headers["location"], headers
        status, _, _ = _get(port, "/mjoin/", {"Authorization": "Bearer not-a-jwt"})
        assert status in (401, 403)

        token = _token(port, senv)
        auth = {"Authorization": f"Bearer {token}"}
        status, _, body = _get(port, "/mjoin/", auth)
        assert status == 200 and QUERY in body.decode(), body[:300]
        status, _, body = _get(port, "/mjoin/api/plans", auth)
        assert status == 200 and QUERY in json.loads(body)
        status, _, body = _get(port, f"/mjoin/reports/{QUERY}/index.html", auth)
        assert status == 200 and b"the evaluation report" in body
        status, _, body = _get(port, f"/mjoin/reports/{QUERY}/index.html", {"Cookie": f"_token={token}"})
        assert status == 200 and b"the evaluation report" in body  # the UI's session cookie

        # files of a listed lake's namespace; an unlisted lake or namespace is a 404
        status, _, body = _get(port, f"/mjoin/files/live/eval~evaluate/{QUERY}/evaluation/index.html", auth)
        assert status == 200 and b"an evaluation namespace's report" in body
        status, _, body = _get(port, f"/mjoin/files/live/live/{QUERY}/index.html", auth)
        assert status == 200 and b"the evaluation report" in body
        for path in (f"/mjoin/files/nope/live/{QUERY}/index.html", f"/mjoin/files/live/eval~nope/{QUERY}/index.html",
                     f"/mjoin/files/live/eval~..%2F..%2Fsecret.txt/{QUERY}/x", "/mjoin/?lake=nope",
                     f"/mjoin/files/live/live/{QUERY}/..%2F..%2Fsecret.txt"):
            status, _, body = _get(port, path, auth)
            assert status in (400, 404) and b"not a report" not in body, (path, status, body)
        status, _, _ = _get(port, f"/mjoin/files/live/eval~evaluate/{QUERY}/evaluation/index.html")
        assert status == 401
        status, _, body = _get(port, "/mjoin/?ns=eval~evaluate", auth)
        assert status == 200 and b"eval/evaluate" in body

        # `query` is validated: `..` (plain or percent-encoded), unknown names, escapes by `name`
        rel = os.path.relpath(raw, lake.root)
        for path in (f"/mjoin/reports/%2E%2E/{rel}", f"/mjoin/reports/../{rel}", "/mjoin/reports/..%2F..%2Fsecret.txt/x",
                     f"/mjoin/reports/nope/{rel}", f"/mjoin/reports/{QUERY}/..%2F..%2F..%2Fsecret.txt",
                     f"/mjoin/reports/{QUERY}/%2E%2E/%2E%2E/{rel}"):
            status, _, body = _get(port, path, auth)
            assert status in (400, 404) and b"PAR1" not in body and b"not a report" not in body, (path, status, body)
