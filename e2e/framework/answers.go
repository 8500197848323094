package framework

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Answer is one answer a driver replica gave the attacher, read from its
// log: a publish or an unpublish that succeeded.
type Answer struct {
	At      time.Time
	Replica string // the log it came from
	Publish bool   // publish success; false: unpublish success
	Volume  string
	Node    string
}

func (a Answer) String() string {
	what := "unpublished from"
	if a.Publish {
		what = "published to"
	}
	return fmt.Sprintf("%s %s: %s %s %s", a.At.Format("15:04:05.000000"), a.Replica, a.Volume, what, a.Node)
}

// The driver logs one line per successful publish ("published") and one
// per answered unpublish ("unpublished"), with klog's text header.
var answerLine = regexp.MustCompile(`^I(\d{4} \d{2}:\d{2}:\d{2}\.\d{6})\s+\d+ \S+\] "(published|unpublished)" (?:.* )?volume="([^"]+)" node="([^"]+)"`)

// DriverAnswers reads the successful publishes and unpublishes from
// driver logs (one per replica; a restarted replica appends to its log),
// ordered by time.
func DriverAnswers(logs ...string) ([]Answer, error) {
	year := time.Now().Year()
	var out []Answer
	err := scanLogs(logs, func(path, line string) error {
		m := answerLine.FindStringSubmatch(line)
		if m == nil {
			return nil
		}
		at, err := time.ParseInLocation("2006 0102 15:04:05.000000", fmt.Sprintf("%d %s", year, m[1]), time.Local)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, Answer{At: at, Replica: strings.TrimSuffix(path[strings.LastIndex(path, "/")+1:], ".log"),
			Publish: m[2] == "published", Volume: m[3], Node: m[4]})
		return nil
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, err
}

// scanLogs calls f for every line of every log.
func scanLogs(logs []string, f func(path, line string) error) error {
	for _, path := range logs {
		file, err := os.Open(path)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(file)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() && err == nil {
			err = f(path, sc.Text())
		}
		if err == nil {
			err = sc.Err()
		}
		file.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// MaxHolders replays the answers for one volume: a node holds it from a
// publish success until an unpublish success for it, whichever replica
// gave them. It returns the most nodes that held it at once and the
// answers up to the first moment that many did.
func MaxHolders(answers []Answer, volume string) (int, []Answer) {
	held := map[string]bool{}
	most := 0
	var seen, worst []Answer
	for _, a := range answers {
		if a.Volume != volume {
			continue
		}
		seen = append(seen, a)
		if a.Publish {
			held[a.Node] = true
		} else {
			delete(held, a.Node)
		}
		if len(held) > most {
			most = len(held)
			worst = append([]Answer(nil), seen...)
		}
	}
	return most, worst
}

// The gRPC interceptor logs each successful call's duration at -v=4.
var publishResponse = regexp.MustCompile(`"response" method="/csi.v1.Controller/ControllerPublishVolume" .* duration="([^"]+)"`)

// PublishDurations reads how long each successful ControllerPublishVolume
// took from driver logs (-v=4), sorted.
func PublishDurations(logs ...string) ([]time.Duration, error) {
	var out []time.Duration
	err := scanLogs(logs, func(_, line string) error {
		if m := publishResponse.FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil {
				out = append(out, d)
			}
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, err
}

// Quantile of sorted durations (nearest rank); zero for none.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1)+0.5)]
}
