"""Packaging beyond pyproject.toml: the Hydra configs stay at the top of the checkout (conf/, as the
docs and `rstitch-run` name them) and ship inside the wheel as the package data rstitch/conf/
(rstitch/configs.py finds either)."""
from setuptools import find_namespace_packages, find_packages, setup

CONF_PACKAGES = ["rstitch.conf", *(f"rstitch.conf.{name}" for name in find_namespace_packages(where="conf"))]

setup(
    packages=[*find_packages(include=["rstitch", "rstitch.*"]), *CONF_PACKAGES],
    package_dir={"rstitch.conf": "conf"},
    package_data={"rstitch": ["testbed/assets/**/*", "methods/*.json"], **{name: ["*.yaml"] for name in CONF_PACKAGES}},
)
