"""`settings.masked`: what a step given variables by name printed, quoted without their values (the fetch step's
credentials, proxy and mirror; docs/settings.md). Generated values and texts: a value of four or more characters,
or the password inside a proxy address, never survives; other text is kept."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from draftscope.core.settings import masked

NAMES = ("HTTPS_PROXY", "HF_ENDPOINT", "HF_TOKEN")
# a URL's userinfo without percent-encoding: unreserved characters and sub-delimiters (RFC 3986), no `$`
word = st.text(alphabet=st.sampled_from("ABCxyz0189-._~!&'()*+,;="), min_size=4)


@given(value=st.text(min_size=4).filter(lambda v: "$" not in v), before=st.text(), after=st.text())
def test_a_value_set_never_survives(value, before, after):
    text = masked(before + value + after, NAMES, {"HF_TOKEN": value})
    assert value not in text


@given(user=word, password=word, host=st.from_regex(r"[a-z]{1,12}(\.[a-z]{2,5})?", fullmatch=True))
def test_a_proxy_password_never_survives_even_quoted_alone(user, password, host):
    proxy = f"http://{user}:{password}@{host}:3128"
    env = {"HTTPS_PROXY": proxy}
    assert masked(f"Cannot connect to proxy {proxy}: refused", NAMES, env) == (
        "Cannot connect to proxy $HTTPS_PROXY: refused"
    )
    quoted = masked(f"auth failed for {user}:{password}@{host}", NAMES, env)
    assert password not in quoted and "$HTTPS_PROXY:password" in quoted


def test_unset_short_and_empty_leave_the_text():
    assert masked("404 for url http://127.0.0.1:9/api", NAMES, {}) == "404 for url http://127.0.0.1:9/api"
    assert (
        masked("abc", NAMES, {"HF_TOKEN": "abc"}) == "abc"
    )  # under four characters: not told from other text
    assert masked(None, NAMES, {"HF_TOKEN": "secret"}) is None
    assert masked("for url http://m.example/api", NAMES, {"HF_ENDPOINT": "http://m.example"}) == (
        "for url $HF_ENDPOINT/api"
    )
