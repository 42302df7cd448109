"""Attribute parity with NVIDIA's driver: every attribute it publishes is ours under the same name
and type, or mapped by `migrate` to one of ours of the same type, or has a documented reason; the
README's mapping table says the same as the code; migrate's classes are the ones we ship."""

from __future__ import annotations

from dradriver.devicemodel import attributes as published
from dradriver.offline.migrate import nvidia
from dradriver.offline.migrate.translate import gpu_class, mig_class
from tests.deploy.manifests import REPO, deviceclasses, markdown_table, unquote

DRIVER = "gpu.dradriver.dev"


def test_every_nvidia_attribute_is_ours_or_mapped_or_explained() -> None:
    for attribute in nvidia.ATTRIBUTES:
        if attribute.ours is None:
            assert attribute.note, f"{attribute.name}: say why there is no equivalent"
            continue
        ours = published.BY_NAME.get(attribute.ours)
        assert ours is not None, (
            f"{attribute.name} maps to {attribute.ours}, which dradriver does not publish"
        )
        assert ours.type == attribute.type, f"{attribute.name}: {attribute.type} but ours is {ours.type}"
        assert attribute.devices <= ours.devices, (
            f"{attribute.name}: on {set(attribute.devices)}, ours on {set(ours.devices)}"
        )
        if attribute.renamed:
            assert attribute.note or attribute.legacy, f"{attribute.name}: say what the mapping changes"
    assert set(nvidia.CAPACITIES) <= set(published.CAPACITIES)


def test_the_documented_mapping_table_is_the_code_s() -> None:
    rows = markdown_table(REPO / "docs" / "tools.md", ["NVIDIA attribute", "type", "on", "dradriver", "note"])
    documented: dict[str, tuple[str, str]] = {}
    for names, types, _on, ours, _note in rows:
        split_names = [unquote(n) for n in names.split(", ")]
        split_types = types.split(", ") if ", " in types else [types] * len(split_names)
        for name, type_ in zip(split_names, split_types, strict=True):
            documented[name] = (type_, unquote(ours))
    assert documented == {a.name: (a.type, a.ours or "—") for a in nvidia.ATTRIBUTES}


def test_migrate_targets_the_classes_dradriver_ships() -> None:
    classes = deviceclasses()
    for name, kind in ((gpu_class(DRIVER), "gpu"), (mig_class(DRIVER), "mig")):
        expression = " ".join(s["cel"]["expression"] for s in classes[name]["spec"]["selectors"])
        assert f'device.attributes["{DRIVER}"].type == "{kind}"' in expression
