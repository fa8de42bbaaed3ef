"""The Redis URL forms (gateway/store/redis_url.py): what each reads to, and the clear
error every unusable one gets at start-up instead of a traceback."""

from __future__ import annotations

import pytest

from gateway.cli import main
from gateway.store import create_store
from gateway.store.redis_url import RedisUrlError, parse_redis_url, redis_url_problem


def test_a_plain_url_is_redis_pys_and_our_options_are_taken_out() -> None:
    t = parse_redis_url("redis://:pw@10.0.0.5:6380/2?health_check_interval=5&wait_replicas=1&wait_timeout_ms=300")
    assert t.topology == "single"
    assert (t.wait_replicas, t.wait_timeout_ms) == (1, 300)
    assert t.url == "redis://:pw@10.0.0.5:6380/2?health_check_interval=5"  # the rest is redis-py's
    assert parse_redis_url("rediss://h/0").wait_replicas == 0  # no WAIT unless asked
    assert parse_redis_url("unix:///run/redis.sock?db=1").topology == "single"


def test_a_sentinel_url_names_the_sentinels_the_master_and_both_passwords() -> None:
    t = parse_redis_url(
        "redis+sentinel://app:s%40cret@s1:26380,s2,[::1]:26381/my-master/3?sentinel_password=sp&sentinel_username=su"
    )
    assert t.topology == "sentinel"
    assert t.nodes == (("s1", 26380), ("s2", 26379), ("::1", 26381))  # 26379: Sentinel's port
    assert (t.master, t.db, t.username, t.password) == ("my-master", 3, "app", "s@cret")
    assert (t.sentinel_username, t.sentinel_password) == ("su", "sp")
    assert t.wait_replicas == 1  # Sentinel's default: a failover loses nothing acknowledged
    assert parse_redis_url("redis+sentinel://s1/m?wait_replicas=0").wait_replicas == 0
    assert parse_redis_url("redis+sentinel://secret@s1/m").password == "secret"  # as redis-py reads it
    assert "s@cret" not in t.describe() and "my-master" in t.describe()


def test_a_cluster_url_lists_startup_nodes_and_cluster_true_is_the_same() -> None:
    t = parse_redis_url("redis+cluster://:pw@n1:7000,n2:7001")
    assert (t.topology, t.nodes, t.password) == ("cluster", (("n1", 7000), ("n2", 7001)), "pw")
    alias = parse_redis_url("redis://:pw@n1:7000/0?cluster=true")
    assert (alias.topology, alias.nodes, alias.password) == ("cluster", (("n1", 7000),), "pw")
    assert parse_redis_url("redis://n1:7000?cluster=false").topology == "single"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://s1:26379", "master's name"),
        ("redis+sentinel://s1/m/0/extra", "master's name"),
        ("redis+sentinel://s1/m/x", "database must be a number"),
        ("redis+sentinel://s1/m?sentinel_pasword=x", "does not take sentinel_pasword"),
        ("redis+sentinel://s1:99999/m", "bad port"),
        ("redis+sentinel://s1,,s2/m", "empty one"),
        ("redis+sentinel://s1/m?wait_replicas=-1", "wait_replicas must be a whole number"),
        ("redis+cluster://n1:7000/1", "database 0 only"),
        ("redis+cluster://n1:7000?wait_replicas=1", "not supported on a cluster"),
        ("redis+cluster://n1:7000?db=0", "does not take db"),
        ("rediss://n1:7000?cluster=true", "redis:// only"),
        ("rediss+cluster://n1:7000", "not supported yet"),
        ("http://n1", "unknown Redis URL scheme"),
    ],
)
def test_an_unusable_url_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(RedisUrlError, match=says):
        parse_redis_url(url)
    problem = redis_url_problem(url)
    assert problem is not None and says in problem


def test_create_store_refuses_a_bad_url_with_the_same_error() -> None:
    with pytest.raises(RedisUrlError, match="master's name"):
        create_store("redis+sentinel://127.0.0.1:1")


def test_serve_with_a_bad_url_exits_2_with_one_line_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--engine", "passthrough", "--redis-url", "redis+sentinel://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "the Redis URL cannot be used" in err and "master's name" in err and "Traceback" not in err
