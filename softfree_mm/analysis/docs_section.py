"""A generated section of a docs page: the text between a tool's two marker lines, replaced on every run."""


def write_section(path: str, section: str, begin: str, end: str, heading: str) -> None:
    """Put ``section`` (which starts with ``begin`` and ends with ``end``) in place of the one between the markers of
    ``path``; a page without them gets it appended under ``## heading``."""
    with open(path) as f:
        text = f.read()
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + f'\n\n## {heading}\n\n' + section + '\n'
    with open(path, 'w') as f:
        f.write(text)
