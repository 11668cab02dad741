"""Bad arguments to the Checkpointer, make_checkpoint, save and should_save,
the read API (load, rows, best_row, current_row), and bad DVC_DALI_* values:
each ends a real script with one line naming the argument (a ConfigError),
no traceback, before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import dvc_dali

PREFIX = "import numpy as np, dvc_dali\nC = dvc_dali.Checkpointer\n"
# a pipeline without data, for the cases that register one
UNIFORM = ("from nvidia.dali import fn, pipeline_def\n"
           "p = pipeline_def(lambda: fn.random.uniform(name='u'))\n"
           "ARGS = dict(batch_size=1, num_threads=1, device_id=None)\n")

# a pipeline reading the directory its argument names
READ = ("import os\nfrom nvidia.dali import fn, pipeline_def\n"
        "r = pipeline_def(lambda root: fn.readers.file(file_root=root, name='f'))\n"
        "ARGS = dict(batch_size=1, num_threads=1, device_id=None)\n")

# id -> (the script's body, the start of the line it must end with)
CASES = {
    "path_int": ("C(5)", "ConfigError: path=5: "),
    "path_none": ("C(None)", "ConfigError: path=None: "),
    "path_file": ("open('afile', 'w').close(); C('afile')",
                  "ConfigError: Checkpointer('afile'): afile is a file, not a directory"),
    # found by a sweep: each was a Python traceback (OSError, FileExistsError...)
    "path_empty": ("C('')", "ConfigError: path='': must be the checkpoint directory"),
    "pipeline_closed": ("c = C('ck'); c.close(); c.pipeline('train', None)",
                        "ConfigError: Checkpointer('ck') is closed: build a new Checkpointer"),
    "path_loop": ("import os; os.symlink('loop', 'loop'); C('loop')",
                  "ConfigError: Checkpointer('loop'): Too many levels of symbolic links; "),
    "path_under_a_file": ("open('afile', 'w').close(); C('afile/sub')",
                          "ConfigError: Checkpointer('afile/sub'): Not a directory; "),
    "path_unwritable": ("C('/proc/self/ck')",
                        "CheckpointWriteError: /proc/self/ck: cannot make its lock file "),
    "params_list": ("C('ck', params=[1, 2])", "ConfigError: params=[1, 2]: must be a dict"),
    "params_not_json": ("C('ck', params={'f': object()})", "Error: params={'f': <object"),
    "params_nan": ("C('ck', params={'lr': float('nan')})", "Error: params={'lr': nan}: "),
    "rng_str": ("C('ck', rng='no')", "ConfigError: rng='no': must be True or False"),
    "async_str": ("C('ck', asynchronous='yes')",
                  "ConfigError: asynchronous='yes': must be True or False"),
    "resume_str": ("C('ck', resume='no')", "ConfigError: resume='no': must be True or False"),
    "total_huge": ("C('ck', total_steps=2**63)", "ConfigError: total_steps=9223372036854775808"),
    "step_neg": ("C('ck').make_checkpoint(-1)", "ConfigError: step=-1: must be an int"),
    "step_str": ("C('ck').make_checkpoint('1')", "ConfigError: step='1': must be an int"),
    "step_float": ("C('ck').make_checkpoint(1.5)", "ConfigError: step=1.5: must be an int"),
    "step_bool": ("C('ck').make_checkpoint(True)", "ConfigError: step=True: must be an int"),
    "step_huge": ("C('ck').make_checkpoint(2**63)", "ConfigError: step=9223372036854775808: "),
    "step_async": ("C('ck', asynchronous=True).make_checkpoint(-1)", "ConfigError: step=-1: "),
    "save_step": ("C('ck').save(-1)", "ConfigError: step=-1: must be an int"),
    "arrays_list": ("C('ck').make_checkpoint(1, arrays=[1, 2])",
                    "ConfigError: arrays: must be a dict of arrays by name, not a list"),
    "arrays_key_int": ("C('ck').make_checkpoint(1, arrays={1: np.ones(2)})",
                       "ConfigError: arrays: the name 1 is a int"),
    "metadata_list": ("C('ck').make_checkpoint(1, metadata=[1])", "ConfigError: metadata=[1]: "),
    "metadata_obj": ("C('ck').make_checkpoint(1, metadata={'x': object()})",
                     "Error: metadata={'x': <object"),
    "metadata_nan": ("C('ck').make_checkpoint(1, metadata={'x': float('nan')})",
                     "Error: metadata={'x': nan}: not plain JSON"),
    "metadata_async": ("C('ck', asynchronous=True).make_checkpoint(1, metadata={'x': 1e999})",
                       "Error: metadata={'x': inf}: not plain JSON"),
    # found by a sweep: int keys came back as strings (a rerun then saw params changed),
    # a deep one was a RecursionError from the refusal itself, a pipeline named 5 came
    # back '5' (its resume refused)
    "params_int_key": ("C('ck', params={'a': {1: 'x'}})",
                       "Error: params['a']: the key 1 is not a string, and would come back as "
                       "'1'"),
    "params_deep": ("d = x = {}\nfor i in range(1000):\n    x['a'] = {}; x = x['a']\n"
                    "C('ck', params=d)", "Error: params=<a dict nested too deep to show>: "),
    "metadata_int_key": ("C('ck').make_checkpoint(1, metadata={2: 'x'})",
                         "Error: metadata: the key 2 is not a string"),
    "pipeline_name_int": ("C('ck').pipeline(5, None)",
                          "ArgumentTypeError: pipeline name 5: must be a non-empty string"),
    "every_0": ("C('ck').should_save(1, 0)", "ConfigError: every=0: must be a whole number"),
    "every_neg": ("C('ck').should_save(1, -5)", "ConfigError: every=-5: must be a whole number"),
    # found by a sweep: '4' failed inside should_save, 1.5 was never due; the bare
    # make_checkpoint took any step outside `dvc exp run`
    "should_save_step_str": ("C('ck').should_save('4', 2)", "ConfigError: step='4': "),
    "should_save_step_float": ("C('ck').should_save(1.5, 2)", "ConfigError: step=1.5: "),
    "bare_step_neg": ("dvc_dali.make_checkpoint(-1)", "ConfigError: step=-1: must be an int"),
    "bare_out_int": ("dvc_dali.make_checkpoint(1, out=5)", "ConfigError: out=5: "),
    "every_bool": ("C('ck').should_save(1, True)", "ConfigError: every=True: "),
    "env_grace": ("import os; os.environ['DVC_DALI_PUSH_GRACE'] = '1e20'; C('ck')",
                  "ConfigError: DVC_DALI_PUSH_GRACE='1e20': must be a number of seconds "
                  "from 0 to 315360000"),
    "env_digest_max": ("import os; os.environ['DVC_DALI_CONTENT_DIGEST_MAX'] = '²'; C('ck')",
                       "ConfigError: DVC_DALI_CONTENT_DIGEST_MAX='²': "),
    "env_verify": ("import os; os.environ['DVC_DALI_VERIFY_BATCHES'] = '²'; C('ck')",
                   "ConfigError: DVC_DALI_VERIFY_BATCHES='²': "),
    # found by a sweep: DALI's RuntimeError, pathlib's TypeError
    "pipeline_same_names": ("from nvidia.dali import fn, pipeline_def\n@pipeline_def\n"
                            "def p():\n    return (fn.random.uniform(name='x'), "
                            "fn.random.normal(name='x'))\n"
                            "C('ck').pipeline('t', p, batch_size=1, num_threads=1, "
                            "device_id=None)",
                            "PipelineBuildError: DALI could not build pipeline 't': The pipeline "
                            "is invalid because it contains operators with non-unique names "
                            "('x'): give each its own."),
    # found by a sweep: an iterator over a ck.pipeline() made as DALI's tutorials do
    # (not ck.iterator) kept its epoch counters unsaved; a resume handed out other
    # batches (a padded duplicate) while the pipeline's digests matched
    "iterator_direct": ("from pathlib import Path; Path('d').mkdir(); np.save('d/a.npy', "
                        "np.zeros(2))\nfrom nvidia.dali import fn, pipeline_def\n"
                        "from nvidia.dali.plugin.pytorch import DALIGenericIterator\n"
                        "p = C('ck').pipeline('t', pipeline_def(lambda: fn.readers.numpy("
                        "file_root='d', name='r')), batch_size=1, num_threads=1, "
                        "device_id=None)\nDALIGenericIterator(p, ['x'], reader_name='r')",
                        "ConfigError: pipeline 't': a DALI iterator was built over it "
                        "directly; its epoch counters would not be saved, so a resume would "
                        "hand out other batches. Build it with ck.iterator("),
    # found by a sweep: DALI's "Cannot serialize an empty checkpoint" traceback
    "dynamic_empty": ("c = C('ck', rng=False)\nc.dynamic()\nc.save(1)",
                      "ConfigError: dynamic-mode checkpoint 'dynamic': nothing is registered "
                      "on it, so no reader's position would be saved."),
    # found by a sweep: "DALI could not build ...: fix the pipeline's arguments"
    "python_function": ("from nvidia.dali import fn, pipeline_def\n"
                        "p = pipeline_def(lambda: fn.python_function(fn.random.uniform("
                        "name='u'), function=lambda x: x))\nC('ck').pipeline('t', p, "
                        "batch_size=1, num_threads=1, device_id=None, exec_async=False, "
                        "exec_pipelined=False)",
                        "UnsupportedPipelineError: pipeline 't': DALI cannot serialize its "
                        "operator nvidia.dali.fn.python_function, and dvc-dali describes"),
    "live_dir_int": ("C('ck').live(dir=5)", "ConfigError: live(dir=5): must be the DVCLive "),
    "live_resume": ("C('ck').live(resume=True)", "ConfigError: live(resume=True): dvc-dali sets "
                    "resume from the checkpoint"),
    # found by a new-user sweep: each was a ValueError or TypeError with a traceback
    "pipeline_twice": (f"c = C('ck')\n{UNIFORM}c.pipeline('t', p, **ARGS)\n"
                       "c.pipeline('t', p, **ARGS)",
                       "ArgumentError: pipeline 't': a pipeline of this name is already "
                       "registered with this Checkpointer; give each pipeline a name of its own"),
    "arrays_object": ("C('ck').make_checkpoint(1, arrays={'w': object()})",
                      "ArgumentTypeError: array 'w': an object cannot be saved without pickle; "
                      "save arrays, tensors"),
    "arrays_namedtuple_async": ("import collections; T = collections.namedtuple('T', 'a')\n"
                                "C('ck', asynchronous=True).make_checkpoint(1, arrays={'w': "
                                "{'x': T(1)}})", "ArgumentTypeError: array 'w/x': a T (a tuple "
                                "subclass) would come back as a plain tuple"),
    "arrays_reserved": ("C('ck').save(1, arrays={'~dvc_dali.rng': 1})",
                        "ArgumentError: arrays: names starting with '~dvc_dali' are dvc-dali's "
                        "own"),
    "pipeline_source_int": ("C('ck').pipeline('t', 5)", "ArgumentTypeError: pipeline 't': "
                            "source=5 is an int; pass a @pipeline_def function"),
    # DALI's "This shouldn't happen" assert (dropped without a word under python -O)
    "pipeline_keyword_typo": (f"{UNIFORM}C('ck').pipeline('t', p, batchsize=2, num_threads=1, "
                              "device_id=None)", "ArgumentTypeError: pipeline 't': batchsize: "
                              "neither <lambda>() nor DALI's Pipeline takes this argument"),
    "iterator_foreign": ("from nvidia.dali.plugin.pytorch import DALIGenericIterator\n"
                         f"{UNIFORM}C('ck').iterator(DALIGenericIterator, p(**ARGS), ['u'])",
                         "ArgumentError: pipelines: a Pipeline was not built by this "
                         "Checkpointer; build the iterator's pipelines with ck.pipeline("),
    "dynamic_name_int": ("C('ck').dynamic(5)", "ArgumentTypeError: dynamic-mode checkpoint name "
                         "5: must be a non-empty string"),
    # found by a new-user sweep: the read API's refusals were tracebacks (no
    # excepthook outside a Checkpointer), its bad types Python's own errors
    "best_row_spec": ("dvc_dali.best_row([], 'acc:maxx')",
                      "ArgumentError: best_row(spec='acc:maxx'): must be '<metric>:max' or "
                      "'<metric>:min'"),
    "best_row_swapped": ("dvc_dali.best_row('acc:max', [])", "ArgumentTypeError: "
                         "best_row(found='acc:max'): must be a list of rows"),
    "rows_outside": ("dvc_dali.rows()", "DvcDaliError: not inside a DVC repository"),
    "rows_repo_int": ("dvc_dali.rows(repo=5)", "ArgumentTypeError: rows(repo=5): must be a "
                      "path"),
    "current_row_int": ("dvc_dali.current_row(5)", "ArgumentTypeError: current_row(path=5): "),
    "load_path_int": ("dvc_dali.load(5)", "ArgumentTypeError: load(path=5): must be a path"),
    # found by a sweep: a name that is not UTF-8 showed as \udcff (raw and in repr)
    "path_file_not_utf8": ("import os; f = os.fsdecode(b'f\\xff'); open(f, 'w').close(); C(f)",
                           "ConfigError: Checkpointer('f\\xff'): f\\xff is a file, not a "
                           "directory"),
    "load_not_utf8": ("import os; dvc_dali.load(os.fsdecode(b'ck\\xff'))",
                      "CheckpointCorruptError: ck\\xff: holds no dvc-dali checkpoint"),
    # found by a sweep: DALI's traceback from inside the pipeline function,
    # "Unsupported argument type with name file_root"; given as an argument
    # of ck.pipeline or read by the function itself
    "file_root_not_utf8": (f"{READ}C('ck').pipeline('t', r, root=os.fsdecode(b'd\\xff'), **ARGS)",
                           "PipelineBuildError: pipeline 't': file_root='d\\xff' (made at "
                           "<string>, line 5) is not UTF-8 (a name with a byte such as \\xff), "
                           "and DALI takes it only as UTF-8 text: rename that directory"),
    "file_list_not_utf8": (f"{READ}C('ck').pipeline('t', pipeline_def(lambda: fn.readers.file("
                           "files=['a', os.fsdecode(b'b\\xff')], name='f')), **ARGS)",
                           "PipelineBuildError: pipeline 't': files='b\\xff' (made at <string>, "
                           "line 7) is not UTF-8"),
    # DALI keeps each operator's script path: the example in a project of such a name
    "script_not_utf8": ("import os, runpy; d = os.fsdecode(b'p\\xff'); os.mkdir(d)\nopen(d + "
                        "'/s.py', 'w').write(" + repr(f"{PREFIX}{READ}C('ck').pipeline('t', r, "
                                                      "root='d', **ARGS)\n") + ")\n"
                        "runpy.run_path(d + '/s.py')",
                        "p\\xff/s.py' (DALI keeps where each operator was made) is not UTF-8 "
                        "(a name with a byte such as \\xff), and DALI takes it only as UTF-8 "
                        "text: move the script (or the project) to a path that is"),
    # were Python's own TypeError for arguments the call does not take, a traceback
    "ck_keyword_typo": ("C('ck', reume=False)", "ArgumentTypeError: Checkpointer(): got an "
                        "unexpected keyword argument 'reume' (did you mean 'resume'?); it takes "
                        "Checkpointer(path='checkpoint', *, resume=True"),
    "bare_too_many": ("dvc_dali.make_checkpoint(1, 2, 3)", "ArgumentTypeError: "
                      "make_checkpoint(): too many positional arguments; it takes "
                      "make_checkpoint(step=None, *, out=None"),
    "rows_unknown": ("dvc_dali.rows(foo=1)", "ArgumentTypeError: rows(): got an unexpected "
                     "keyword argument 'foo'; it takes rows(exp=None"),
    "best_row_missing": ("dvc_dali.best_row([])", "ArgumentTypeError: best_row(): missing a "
                         "required argument: 'spec'"),
    "save_no_step": ("C('ck').save()", "ArgumentTypeError: Checkpointer.save(): missing a "
                     "required argument: 'step'; it takes Checkpointer.save(step, arrays=None, "
                     "metadata=None)"),
    "tf_dataset_no_source": ("C('ck').tf_dataset('t')", "ArgumentTypeError: "
                             "Checkpointer.tf_dataset(): missing a required argument: 'source'"),
    "keras_callback_unknown": ("C('ck').keras_callback(10, x=1)", "ArgumentTypeError: "
                               "Checkpointer.keras_callback(): got an unexpected keyword "
                               "argument 'x'; it takes Checkpointer.keras_callback(every, "),
}


def run_case(root: Path, case: str) -> subprocess.CompletedProcess:
    cwd = root / case
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DVC_") or k == "DVC_NO_ANALYTICS"}
    env["PYTHONPATH"] = str(Path(dvc_dali.__file__).resolve().parents[1])
    script = PREFIX + CASES[case][0] + "\nprint('ACCEPTED')\n"
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case's script, run at once (one interpreter each)."""
    root = tmp_path_factory.mktemp("bad_inputs_api")
    with ThreadPoolExecutor(8) as pool:
        return dict(zip(CASES, pool.map(lambda c: run_case(root, c), CASES))) | {"": root}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_argument_ends_in_one_line_naming_it(outcomes, case):
    proc = outcomes[case]
    said = [line for line in proc.stderr.splitlines() if "not running under" not in line]
    assert proc.returncode == 1 and "ACCEPTED" not in proc.stdout, (case, proc.stdout,
                                                                   proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(said) == 1 and said[0].startswith("dvc-dali: "), said
    assert said[0][len("dvc-dali: "):].split(": ", 1)[0].endswith("Error")
    assert CASES[case][1] in said[0], said[0]
    written = outcomes[""] / case / "ck"
    assert not (written / "LATEST").exists()  # refused before any checkpoint


def test_the_good_values_are_still_taken(tmp_path):
    ck = dvc_dali.Checkpointer(tmp_path / "ck", resume=False, params={"lr": 0.1},
                               asynchronous=None, rng=False, total_steps=5)
    assert ck.should_save(4, 2) and not ck.should_save(3, np.int64(2))
    ck.make_checkpoint(2, arrays={"w": np.ones(2)}, metadata={"note": "ok"})
    ck.save(3, arrays=None, metadata=None)
    ck.close()
    back = dvc_dali.Checkpointer(str(tmp_path / "ck"), rng=True, asynchronous=False)
    assert back.step == 3 and back.params == {}
    back.close()


def test_a_checkpoint_directory_named_in_bytes_that_are_not_utf8_is_kept_and_named(tmp_path):
    """Its lock's name was a UnicodeEncodeError traceback (found by a sweep);
    a refusal naming it showed ck\\udcff."""
    path = tmp_path / os.fsdecode(b"ck\xff")
    ck = dvc_dali.Checkpointer(path, rng=False)
    ck.save(1, arrays={"w": np.ones(2)})
    ck.close()
    back = dvc_dali.Checkpointer(path, rng=False)
    assert back.step == 1 and back.arrays["w"].tolist() == [1.0, 1.0]
    back.close()
    (path / "LATEST").write_text("garbage")
    with pytest.raises(dvc_dali.CheckpointCorruptError) as err:
        dvc_dali.Checkpointer(path, rng=False)
    assert "ck\\xff/LATEST: does not hold" in str(err.value), str(err.value)
    assert "\\udc" not in str(err.value) and "\udcff" not in str(err.value)
