// The service's refusals as the page says them, one home for the form (form.js errorItem) and the Serve card
// (serve.js errorText). Review r15d #6: the work-budget refusal was put in words on the form alone, while its
// neighbours still named the operator's settings and printed raw numbers: "num_nodes x devices_per_node = 20000 x 8 =
// 160000 devices; this service prices at most 131072 (COMMPLAN_MAX_DEVICES)", "Input should be less than or equal to
// 131072, got 1000000000" (pydantic's le), a torus over COMMPLAN_MAX_ROUTER_PAIRS (app/limits.py check_router), and
// the Serve card's deployment over COMMPLAN_MAX_WORK (app/convert.py serve_request: refuse(..., "deployment")).
const INT = new Intl.NumberFormat("en-US");

// an operator's setting (app/settings.py: COMMPLAN_*) said as what it is to the user, and integers of five or more
// digits grouped by thousands (not inside a decimal's fraction, "0.0275237", nor a word: a commit "0005973a84f7")
export const plainLimits = (msg) => String(msg)
  .replace(/\bCOMMPLAN_[A-Z_]+\b/g, "this server's limit")
  .replace(/(?<![\w.,])\d{5,}(?![\w.])/g, (n) => INT.format(Number(n)));

// app/limits.py refuse: "estimated work 19,088,108,752 units is over this service's budget of 134,217,728
// (COMMPLAN_MAX_WORK); the largest part: dp.grad_norm (allreduce on 1 groups of 16384 ranks, schedules), 123 units
// (docs/hardening.md ...)" as its three parts in words, or null for any other message
export function budgetParts(msg) {
  const m = /estimated work ([\d,]+) units is over this service's budget of ([\d,]+).*?the largest part: (.*?), [\d,]+ units \(/.exec(String(msg));
  if (!m) return null;
  return { units: m[1], budget: m[2], part: m[3].replace(/\b1 groups\b/, "one group").replace(/\d{4,}/g, (n) => INT.format(Number(n))) };
}
