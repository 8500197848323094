package rds

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The RDS's clock and its files' last-modified times are local wall-clock
// times without a zone. They are read here as if they were UTC and are
// only ever compared with each other, never with this machine's clock
// (which an RDS without NTP may be far from). A clock change between the
// two readings (daylight saving) shifts the difference by up to an hour:
// whoever judges an age by them allows for it.

// routerOSDateLayouts: RouterOS 7.10 and later print dates as 2026-11-22;
// earlier ones as nov/22/2026 (the month in any case).
var routerOSDateLayouts = []string{"2006-01-02", "Jan/02/2006"}

// parseRouterOSTime reads a date and a time of day as RouterOS prints
// them (`2026-11-22`, `nov/22/2026`; `10:00:01`).
func parseRouterOSTime(date, clock string) (time.Time, error) {
	date, clock = strings.TrimSpace(date), strings.TrimSpace(clock)
	for _, layout := range routerOSDateLayouts {
		if t, err := time.Parse(layout+" 15:04:05", date+" "+clock); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%w: date %q and time %q are not like 2026-11-22 10:00:01 or nov/22/2026 10:00:01", ErrBadOutput, truncate(date), truncate(clock))
}

// parseLastModified reads a /file entry's last-modified (`2026-11-22
// 10:00:01`), or returns the zero time when it is absent or unreadable.
func parseLastModified(s string) time.Time {
	date, clock, ok := strings.Cut(strings.TrimSpace(s), " ")
	if !ok {
		return time.Time{}
	}
	t, err := parseRouterOSTime(date, clock)
	if err != nil {
		return time.Time{}
	}
	return t
}

// Clock reads the RDS's own clock (`/system clock print`: time and
// date), in the form File.Modified is read: local wall-clock time as if
// UTC.
func (c *Client) Clock(ctx context.Context) (time.Time, error) {
	out, err := c.run(ctx, "/system clock print")
	if err != nil {
		return time.Time{}, err
	}
	v, err := ParseResource(out)
	if err != nil {
		return time.Time{}, err
	}
	return parseRouterOSTime(v["date"], v["time"])
}
