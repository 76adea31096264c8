"""/redoc loads nothing from outside (polish6): ReDoc 2.5.4's sidebar footer fetched its logo from
https://cdn.redoc.ly/redoc/logo-mini.svg, which the CSP's img-src blocks (a violation on every visit). The vendored
bundle carries one change, an empty inline SVG in its place (frontend/vendor/redoc-2.5.4/PATCHED.md); the CSP is
not widened for it."""

from __future__ import annotations

import re


def test_redoc_bundle_loads_no_remote_image_and_the_csp_stays_closed(api):
    page = api.get("/redoc")
    csp = page.headers["content-security-policy"]
    img_src = re.search(r"img-src ([^;]*);", csp)[1].split()
    assert img_src == ["'self'", "data:", "blob:"] and "redoc" not in csp
    src = re.search(r'<script src="([^"]+redoc\.standalone\.js)"', page.text)[1]
    bundle = api.get(src)
    assert bundle.status_code == 200 and len(bundle.content) > 500_000
    assert "cdn.redoc.ly" not in bundle.text and "https://cdn" not in bundle.text
    # the logo is still drawn by the same component, from a data: URI the CSP allows
    logo = re.search(r'alt:"redocly logo",onError:[^,]+,src:"([^"]+)"', bundle.text)
    assert logo and logo[1].startswith("data:image/svg+xml,")
    assert "width=%270%27 height=%270%27" in logo[1]  # unsized, Chromium drew it as a 15 x 150 px blank box
