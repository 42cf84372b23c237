"""Grading coursework with the spec suite (``python tools/grade.py``).

- ``rubric``: the editable rubric (``rubric.toml``) and the points, visibility and tags of each test;
- ``recording``: the trusted pass that runs the suite on the reference, recording expected values
  and the list of graded tests (``manifest``);
- ``runner``: runs a submission's tests in isolated child processes (``child``, ``guard``) and
  survives hangs, crashes, ``sys.exit`` and runaway memory;
- ``report``: the grade and its forms (terminal table, Gradescope ``results.json``, Markdown,
  JUnit XML, CSV gradebook);
- ``submission``: staging submissions and static integrity checks (``solution_scan``);
- ``progress``: the progress bar.
"""
