"""Documents translated by a model: `transduce translate MODEL --file` (the default output name, a
one-line error and no output for a file it cannot read) and the server's LibreTranslate file
routes, POST /translate_file and GET /download_file/ID, through a live `transduce serve` with a
tiny model: the downloaded file opens in python-docx and holds what `translate --file` writes.
The downloads' store: files expire, and the oldest go to keep it within its count and size."""

import json
import os
import time
from io import BytesIO

import pytest

docx = pytest.importorskip("docx")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("python_multipart")

from serving import start_serve  # noqa: E402
from test_documents import build_docx  # noqa: E402
from tiny_models import make_model  # noqa: E402

from transduce.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model whose data.json names its languages, en -> de."""
    d = make_model(tmp_path_factory.mktemp("documents"), shared=False)
    meta = json.loads((d / "data.json").read_text())
    (d / "data.json").write_text(json.dumps({**meta, "src_lang": "en", "tgt_lang": "de"}))
    return d


def texts(data: bytes) -> list[str]:
    """Every paragraph's text of a .docx: the body's, the table's, the header's and footer's."""
    d = docx.Document(BytesIO(data))
    section = d.sections[0]
    return (
        [p.text for p in d.paragraphs]
        + [c.text for c in d.tables[0]._cells]
        + [section.header.paragraphs[0].text, section.footer.paragraphs[0].text]
    )


@pytest.fixture(scope="module")
def cli_output(model_dir, tmp_path_factory):
    """`transduce translate MODEL --file report.docx` (beam 2, fp32): the file it wrote."""
    d = tmp_path_factory.mktemp("cli")
    (d / "report.docx").write_bytes(build_docx())
    assert (
        main(
            ["translate", str(model_dir), "--file", str(d / "report.docx"), "--beam", "2", "--precision", "fp32", "-q"]
        )
        == 0
    )
    return (d / "report.de.docx").read_bytes()  # the model's target language in the default name


def test_translate_file_writes_the_document_beside_it(cli_output):
    before, after = texts(build_docx()), texts(cli_output)
    assert len(after) == len(before)
    assert all(a != b for a, b in zip(after, before) if any(c.isalpha() for c in b))  # every text translated


def test_translate_file_refuses_in_one_line_and_writes_nothing(model_dir, tmp_path, capsys):
    (tmp_path / "notes.xml").write_text("<a/>")
    (tmp_path / "broken.docx").write_bytes(b"not a zip")
    for name, why in (
        ("notes.xml", ".xml files are not translated"),
        ("broken.docx", "not a readable Word (.docx) file"),
        ("missing.odt", "No such file or directory"),
    ):
        assert main(["translate", str(model_dir), "--file", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.docx", "notes.xml"]
    assert main(["translate", str(model_dir), "--file", str(tmp_path / "broken.docx"), "-i", "x.txt"]) == 2
    assert "--input does not apply to --file" in capsys.readouterr().err


def test_translate_file_and_download_file_on_a_live_server(model_dir, cli_output):
    proc, url = start_serve([str(model_dir), "--beam", "2", "--precision", "fp32"])
    try:
        settings = httpx.get(url + "/frontend/settings").json()
        assert settings["filesTranslation"] is True and ".docx" in settings["supportedFilesFormat"]
        files = {
            "file": (
                "report.docx",
                build_docx(),
                "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            )
        }
        r = httpx.post(url + "/translate_file", files=files, data={"source": "en", "target": "de"}, timeout=60)
        assert r.status_code == 200, r.text
        link = r.json()["translatedFileUrl"]
        assert link.startswith(url + "/download_file/") and link.endswith(".report_de.docx")
        got = httpx.get(link)
        assert got.status_code == 200 and 'filename="report_de.docx"' in got.headers["content-disposition"]
        assert texts(got.content) == texts(cli_output)  # the server's translation is translate --file's
        r = httpx.post(url + "/libretranslate/translate_file", files=files, data={"source": "auto", "target": "de"})
        assert r.json()["translatedFileUrl"].startswith(url + "/libretranslate/download_file/")

        def refused(status, message, **form):
            r = httpx.post(url + "/translate_file", **form)
            assert (r.status_code, r.json()) == (status, {"error": message})

        refused(400, "Invalid request: missing target parameter", files=files, data={"source": "en"})
        refused(
            400,
            "Invalid request: missing file parameter",
            data={"source": "en", "target": "de"},
            files={"other": ("x.txt", b"hello")},
        )
        refused(
            400,
            "Invalid request: file format not supported",
            files={"file": ("notes.xml", b"<a/>")},
            data={"source": "en", "target": "de"},
        )
        refused(
            400,
            "French (fr) is not available as a target language from English (en): this server translates "
            "English (en) into German (de)",
            files=files,
            data={"source": "en", "target": "fr"},
        )
        r = httpx.post(
            url + "/translate_file", files={"file": ("broken.pptx", b"junk")}, data={"source": "en", "target": "de"}
        )
        assert r.status_code == 400 and r.json()["error"].startswith(
            "Invalid request: broken.pptx: not a readable PowerPoint"
        )
        assert httpx.get(url + "/download_file/00000000-0000-0000-0000-000000000000.x.docx").status_code == 404
        assert httpx.get(url + "/download_file/..%2F..%2Fetc%2Fpasswd").status_code in (400, 404)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_downloads_expire_and_stay_within_their_count_and_size(tmp_path):
    from transduce.serve.documents import Downloads

    store = Downloads(tmp_path, ttl=3600, max_files=2, max_bytes=10)
    first, second = store.put("a_de.txt", b"1234"), store.put("b_de.txt", b"5678")
    assert store.get(first).read_bytes() == b"1234" and first.endswith(".a_de.txt")
    old = time.time() - 10
    os.utime(tmp_path / first, (old, old))  # the oldest
    third = store.put("c_de.txt", b"90")  # a third file: the oldest goes
    assert store.get(first) is None and store.get(second) and store.get(third)
    fourth = store.put("d_de.txt", b"abcdefgh")  # 4 + 2 + 8 bytes are more than 10: the oldest goes
    assert store.get(second) is None and store.get(third) and store.get(fourth)
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) == 10
    store.ttl = 0
    time.sleep(0.01)
    assert store.get(store.put("e.txt", b"x")) is None  # expired at once
    assert store.get("../secret") is None and store.get("not-an-id") is None
