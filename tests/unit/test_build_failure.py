"""dali_state.build_failure: the one line said of DALI's build error."""

from __future__ import annotations

import pytest

from dvc_dali.dali.dali_state import build_failure

NO_FILES = '''Critical error when building pipeline:
Error in CPU operator `nvidia.dali.fn.readers.file`,
which was used in the pipeline definition with the following traceback:

  File "/home/u/lib/loaders.py", line 9, in images
    return make()
  File "/home/u/p/train.py", line 18, in images
    files, labels = fn.readers.file(file_root=data, name="reader")

encountered:

Assert on "SizeImpl() > 0" failed: No files found.
C++ context: [/opt/dali/dali/operators/reader/loader/file_label_loader.h:198]
Current pipeline object is no longer valid.'''

MIXED = '''Critical error when building pipeline:
Error in MIXED operator `nvidia.dali.fn.decoders.image`,
which was used in the pipeline definition with the following traceback:

  File "/p/train.py", line 20, in images

encountered:

Unknown output type: 99
Current pipeline object is no longer valid.'''

TAIL = " Fix the pipeline's arguments or the files it reads, then rerun."


@pytest.mark.parametrize("text, said", [
    (NO_FILES, "DALI could not build pipeline 'p' in its CPU operator nvidia.dali.fn.readers.file "
               "(made at train.py, line 18): No files found."),  # the innermost frame: the call
    (MIXED, "DALI could not build pipeline 'p' in its MIXED operator "
            "nvidia.dali.fn.decoders.image (made at train.py, line 20): Unknown output type: 99"),
    ("Something else went wrong\nC++ context: [x.h:1]",
     "DALI could not build pipeline 'p': Something else went wrong"),
    ("", "DALI could not build pipeline 'p': an error with no message"),
    ("The pipeline is invalid because it contains operators with non-unique names:\n"
     "{'x': [<nvidia.dali.ops._OperatorInstance object at 0x7f>, <nvidia.dali.ops."
     "_OperatorInstance object at 0x7e>], 'it\\'s': [<nvidia.dali.ops._OperatorInstance>]}",
     "DALI could not build pipeline 'p': The pipeline is invalid because it contains operators "
     "with non-unique names ('x', 'it\\'s'): give each its own."),
    ("Critical error when building pipeline:\nencountered:\n\n",
     "DALI could not build pipeline 'p': an error with no message"),
])
def test_dali_build_errors_are_said_in_one_line(text, said):
    assert build_failure("p", text) == said + TAIL
    assert "\n" not in build_failure("p", text)
