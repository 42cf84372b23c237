"""Grading coursework with the spec suite (``spec-grade``), and the student handout (``spec-handout``).

The submission runs; a trusted process judges. Per submission, the grader (``cli``) starts a judge
(``judge``): ``pytest spec_tests --spec-remote=<staged copy> -p spec_grading.collector``, which runs
the submission only in the harness's sandboxed worker, compares with the live reference, and
writes each test's verdict as data (``collector``). The grader builds the grade from those
verdicts alone (``grade``) and writes the reports (``report``) once the judge is gone.

- ``rubric``: the editable rubric (``rubric.toml``): points, visibility, limits, capabilities;
- ``manifest``: the graded tests, from a trusted pass on the reference (cached, digest-verified);
- ``judge`` / ``collector``: the judge process and its pytest plugin;
- ``grade`` / ``report``: points, and the grade's forms (terminal, Gradescope, Markdown, JUnit, CSV);
- ``submission``: finding and staging submissions, static flags for staff (``solution_scan``);
- ``workspace``: the grader's temporary folders, removed even when it is stopped;
- ``textsafe``: sanitised, capped text and atomic writes;
- ``autograder``: the Gradescope autograder zip; ``handout``: the student handout;
- ``progress``: the progress bar.
"""
