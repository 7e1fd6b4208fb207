"""What the browser tests check of a page's layout, in one place."""

from __future__ import annotations

OVERLAPS = """
const shown = [...document.querySelectorAll(arguments[0])].filter(e => e.offsetParent !== null);
const pairs = [];
shown.forEach((a, i) => shown.slice(i + 1).forEach(b => {
  if (a.contains(b) || b.contains(a)) return;  // one inside the other is layout, not overlap
  const r = a.getBoundingClientRect(), q = b.getBoundingClientRect();
  if (r.left < q.right - 0.5 && q.left < r.right - 0.5 && r.top < q.bottom - 0.5 && q.top < r.bottom - 0.5)
    pairs.push([a.tagName + "." + a.className, b.tagName + "." + b.className]);
}));
return pairs;
"""


def overlaps(browser, selector: str) -> list[list[str]]:
    """Pairs of visible elements matching `selector`, neither inside the other, whose boxes intersect."""
    return browser.execute_script(OVERLAPS, selector)
