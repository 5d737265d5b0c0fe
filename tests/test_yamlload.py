"""The bounded, position-tracking YAML loader."""
from __future__ import annotations

import pytest

from gitops.model.yamlload import MAX_NODES_PER_FILE, YamlError, load_yaml_documents


def billion_laughs(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijklmnop"
    for i in range(1, levels):
        prev, cur = names[i - 1], names[i]
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_positions_of_fields_and_items():
    (doc,) = load_yaml_documents("kind: X\nspec:\n  ports:\n    - 1\n    - 2\n  name: n\n")
    assert doc.line == 1
    assert doc.data == {"kind": "X", "spec": {"ports": [1, 2], "name": "n"}}
    assert doc.positions[("spec",)] == 2
    assert doc.positions[("spec", "ports", 1)] == 5
    assert doc.positions[("spec", "name")] == 6


def test_multi_document_stream_keeps_document_lines_and_drops_empty_ones():
    docs = load_yaml_documents("---\na: 1\n---\n---\n# only a comment\n---\nb: 2\n")
    assert [(d.line, d.data) for d in docs] == [(2, {"a": 1}), (7, {"b": 2})]


def test_duplicate_key_is_refused_with_both_lines():
    with pytest.raises(YamlError) as err:
        load_yaml_documents("spec:\n  ipAddress: 1.2.3.4\n  public: true\n  ipAddress: 5.6.7.8\n")
    assert err.value.line == 4
    assert "duplicate key 'ipAddress' (first at line 2)" in err.value.message
    assert err.value.path == ("spec", "ipAddress")


def test_yaml_bomb_is_refused_not_expanded():
    with pytest.raises(YamlError) as err:
        load_yaml_documents(billion_laughs())
    assert f"more than {MAX_NODES_PER_FILE} nodes" in err.value.message


def test_small_aliases_still_work():
    (doc,) = load_yaml_documents("base: &b {x: 1}\nother: *b\nmerged:\n  <<: *b\n  y: 2\n")
    assert doc.data == {"base": {"x": 1}, "other": {"x": 1}, "merged": {"y": 2, "x": 1}}


def test_recursive_alias_is_refused():
    with pytest.raises(YamlError) as err:
        load_yaml_documents("a: &a [*a]\n")
    assert "nesting deeper than" in err.value.message


@pytest.mark.parametrize(
    "content, line, fragment",
    [
        (b"\x7fELF\x02\x01\x01\x00\x00", 1, "binary file"),
        (b"a: 1\nb: \xff\xfe\n", 2, "not UTF-8"),
        ("a: [1, 2\nb: 3\n", 2, "invalid YAML"),
        ("a: 1\n  b: 2\n", 2, "invalid YAML"),
        ("a: !!python/object:os.system ls\n", 1, "unsupported YAML tag"),
    ],
)
def test_non_yaml_content_is_refused_with_a_line(content, line, fragment):
    with pytest.raises(YamlError) as err:
        load_yaml_documents(content)
    assert err.value.line == line
    assert fragment in err.value.message


def test_scalars_resolve_like_kubernetes_tooling():
    (doc,) = load_yaml_documents("mac: 52:54:00:12:34:56\ntime: 1:30\nport: 6443\nratio: 0.5\non: true\nday: 2024-01-02\n")
    assert doc.data == {"mac": "52:54:00:12:34:56", "time": "1:30", "port": 6443, "ratio": 0.5,
                        "on": True, "day": "2024-01-02"}
