"""The Prometheus scrape configuration the demo writes (the live checks are in tests/e2e)."""

from __future__ import annotations

import yaml

from tools.demo.prometheus import scrape_config


def test_scrape_config_targets_and_fractional_interval() -> None:
    doc = yaml.safe_load(scrape_config(["127.0.0.1:9001", "127.0.0.1:9002"], 0.5))
    assert doc["global"] == {"scrape_interval": "500ms", "scrape_timeout": "500ms"}
    (job,) = doc["scrape_configs"]
    assert job["job_name"] == "zonemeter"
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9001", "127.0.0.1:9002"]}]
    assert yaml.safe_load(scrape_config(["a:1"], 2))["global"]["scrape_interval"] == "2000ms"
