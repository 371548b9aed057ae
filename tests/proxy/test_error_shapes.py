"""Every error body is OpenAI's shape (issue 31): ``message``, ``type``, ``param``, ``code`` (a
string or null) — the proxy's own refusals, and the framework's 404 / 405 — as the official
``openai`` SDK reads them."""

from __future__ import annotations

import httpx
import openai
import pytest

from kvcake.launch.launcher import Cluster


def shaped(r: httpx.Response) -> dict[str, object]:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["code"] is None or isinstance(err["code"], str)
    return dict(err)


def test_unknown_path_and_wrong_method(emulated_cluster: Cluster) -> None:
    url = emulated_cluster.url
    r = httpx.get(url + "/v1/nothing-here", timeout=10)
    assert r.status_code == 404 and shaped(r)["code"] == "not_found"
    r = httpx.get(url + "/v1/completions", timeout=10)  # POST only
    assert r.status_code == 405 and shaped(r)["code"] == "method_not_allowed"
    assert "allow" in r.headers
    r = httpx.get(url + "/dashboard/static/nope.js", timeout=10)
    assert r.status_code == 404 and shaped(r)["type"] == "not_found_error"
    r = httpx.get(url + "/dashboard/api/snapshot?recent=0", timeout=10)
    assert r.status_code == 400 and shaped(r)["code"] is None


def test_the_sdk_reads_every_field(emulated_cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=emulated_cluster.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError) as nf:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    assert nf.value.code == "model_not_found" and nf.value.param == "model"
    assert nf.value.type == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=emulated_cluster.conf.kv.model, prompt="hi",
                                  max_tokens=0)  # fmt: skip
    assert bad.value.type == "invalid_request_error" and bad.value.code is None
    assert "max_tokens" in bad.value.message
    with pytest.raises(openai.NotFoundError) as path:
        client.get("/nothing", cast_to=object)
    assert path.value.code == "not_found"
    with pytest.raises(openai.APIStatusError) as method:
        client.delete("/completions", cast_to=object)
    assert method.value.status_code == 405 and method.value.code == "method_not_allowed"
