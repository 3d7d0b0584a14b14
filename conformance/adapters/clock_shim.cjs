// The conformance harness's clock hook for Node.js daemons (conformance/launch.py, `{clock_file}`): loaded with
// `node --require`, it adds the seconds written in $MESHCONFORM_CLOCK_FILE to Date.now() and `new Date()`,
// re-reading the file when it changes (checked at most every 50 ms). Timers and performance.now() are untouched.
"use strict";
const fs = require("node:fs");

const file = process.env.MESHCONFORM_CLOCK_FILE;
if (file) {
  const RealDate = Date;
  const realNow = RealDate.now.bind(RealDate);
  let offsetMs = 0;
  let seenMtime = -1;
  let checkedAt = 0;
  const refresh = () => {
    try {
      const mtime = fs.statSync(file).mtimeMs;
      if (mtime === seenMtime) return;
      const value = Number.parseFloat(fs.readFileSync(file, "ascii").trim() || "0");
      if (Number.isFinite(value)) {
        offsetMs = Math.round(value * 1000);
        seenMtime = mtime;
      }
    } catch {
      /* no file yet: keep the last offset */
    }
  };
  const now = () => {
    const real = realNow();
    if (real - checkedAt >= 50) {
      checkedAt = real;
      refresh();
    }
    return real + offsetMs;
  };
  class HookedDate extends RealDate {
    constructor(...args) {
      if (args.length === 0) super(now());
      else super(...args);
    }
    static now() {
      return now();
    }
  }
  globalThis.Date = HookedDate;
}
