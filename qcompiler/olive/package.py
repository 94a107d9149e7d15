"""The package-config entry of `QcompilerQuantization` and Olive's default config with it added.

NOTE: Olive reads one package config per run and it replaces the default list instead of adding to it (a config
holding only our entry would lose every built-in pass of the workflow), so we hand back the whole merged dict.
"""
from __future__ import annotations

from olive.package_config import OlivePackageConfig

PASS_NAME = "QcompilerQuantization"
MODULE_PATH = "qcompiler.olive.quantization." + PASS_NAME


def pass_entry() -> dict:
    """Our pass as a package config lists it: where it is, what it supports, whether it needs data (it does
    not: weight-only quantization runs without calibration data)."""
    return {
        "module_path": MODULE_PATH,
        "supported_providers": ["*"],
        "supported_accelerators": ["*"],
        "supported_precisions": ["int4", "int8", "int16", "uint8", "uint16"],
        "supported_algorithms": ["rtn", "gptq", "awq", "adaround", "seqmse"],
        "supported_quantization_encodings": ["qdq"],
        "dataset": "dataset_optional",
    }


def package_config() -> dict:
    """Olive's default package config (`OlivePackageConfig.load_default_config()`) with our pass added: the dict
    to give `olive.workflows.run(workflow, package_config=...)` or to write as the JSON of
    `olive run --package-config`."""
    merged = OlivePackageConfig.load_default_config().model_dump(mode="json")
    merged["passes"] = {**merged["passes"], PASS_NAME: pass_entry()}
    return merged
