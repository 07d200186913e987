// Command noopcni is the local cluster's only network plugin after Debian's
// loopback. It creates nothing: pods keep just their own `lo`, and no host
// interface, route or address is ever made. It only reports an `eth0` with
// 127.0.0.1/8 in its result, because containerd refuses a sandbox whose CNI
// result has no eth0 ("failed to find network info for sandbox").
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

func main() {
	switch os.Getenv("CNI_COMMAND") {
	case "ADD":
		var conf struct {
			CNIVersion string `json:"cniVersion"`
		}
		in, _ := io.ReadAll(os.Stdin)
		if err := json.Unmarshal(in, &conf); err != nil || conf.CNIVersion == "" {
			conf.CNIVersion = "1.0.0"
		}
		ip := map[string]any{"address": "127.0.0.1/8", "interface": 0}
		if conf.CNIVersion < "0.4" { // 0.3.x results carry an IP version
			ip["version"] = "4"
		}
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
			"cniVersion": conf.CNIVersion,
			"interfaces": []map[string]string{{"name": "eth0", "sandbox": os.Getenv("CNI_NETNS")}},
			"ips":        []any{ip},
		})
	case "VERSION":
		fmt.Println(`{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}`)
	default: // DEL, CHECK, GC, STATUS: nothing was made, nothing to do.
	}
}
