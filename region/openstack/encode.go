package openstack

import (
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/computeql/computeql/region"
)

// Metadata keys of what a server carries.
const (
	metaInstance       = "compute:instance-id"
	metaOrg            = "compute:org"
	metaProject        = "compute:project"
	metaRegion         = "compute:region"
	metaNetwork        = "compute:network"
	metaFlavor         = "compute:flavor"
	metaImage          = "compute:image"
	metaSSHCA          = "compute:ssh-ca"
	metaSecurityGroups = "compute:security-groups"
	metaAllowed        = "compute:allowed-sources"
	metaPublicIP       = "compute:public-ip"
	metaPort           = "compute:port"
	metaAllowGroup     = "compute:allow-group"
	metaLarge          = "compute:large"
	metaTagPrefix      = "compute:tag:"
)

// instanceTagPrefix starts the Nova tag of region.InstanceTag.
const instanceTagPrefix = "instance-id="

// Nova's limits on what a server carries.
const (
	maxTagLen      = 60
	maxMetadataLen = 255
)

// descriptionPrefix starts the description that outlives a server's metadata.
const descriptionPrefix = "computeql "

// novaTag is the Nova tag of the instance tag's value, which must fit Nova's rules.
func novaTag(value string) (string, error) {
	t := instanceTagPrefix + value
	if value == "" || len(t) > maxTagLen || strings.ContainsAny(value, "/,") {
		return "", fmt.Errorf("instance tag %q: OpenStack takes values of 1 to %d characters without '/' or ',': %w",
			value, maxTagLen-len(instanceTagPrefix), region.ErrRefused)
	}
	return t, nil
}

// tagKeyByte reports whether a byte of a tag's key is written as it is in a metadata key;
// '.' is the escape, so it is escaped itself, and ':' separates the key's parts.
func tagKeyByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-' || b == '_'
}

// encodeTagKey is the metadata key of a tag.
func encodeTagKey(k string) string {
	var b strings.Builder
	b.WriteString(metaTagPrefix)
	for i := 0; i < len(k); i++ {
		if c := k[i]; tagKeyByte(c) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, ".%02X", c)
		}
	}
	return b.String()
}

// decodeTagKey is the tag of a metadata key, if it is one that encodeTagKey wrote.
func decodeTagKey(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, metaTagPrefix)
	if !ok {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(rest); i++ {
		if rest[i] != '.' {
			b.WriteByte(rest[i])
			continue
		}
		if i+3 > len(rest) {
			return "", false
		}
		v, err := strconv.ParseUint(rest[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), true
}

// encodeSpec is the metadata, the Nova tags and the description of a server of the spec.
func encodeSpec(spec region.ServerSpec) (map[string]string, []string, string, error) {
	value := spec.Tags[region.InstanceTag]
	tag, err := novaTag(value)
	if err != nil {
		return nil, nil, "", err
	}
	md := map[string]string{
		metaInstance: value,
		metaOrg:      spec.OrganizationID,
		metaProject:  spec.ProjectID,
		metaRegion:   spec.RegionID,
		metaNetwork:  spec.NetworkID,
		metaFlavor:   spec.FlavorID,
		metaImage:    spec.ImageID,
	}
	if spec.SSHCertificateAuthorityID != "" {
		md[metaSSHCA] = spec.SSHCertificateAuthorityID
	}
	maps.Copy(md, encodeNetworking(spec.Networking))
	for k, v := range spec.Tags {
		if k != region.InstanceTag {
			md[encodeTagKey(k)] = v
		}
	}
	for k, v := range md {
		if len(k) > maxMetadataLen || len(v) > maxMetadataLen {
			return nil, nil, "", fmt.Errorf("%s=%q: OpenStack takes metadata of at most %d characters: %w", k, v, maxMetadataLen, region.ErrRefused)
		}
	}
	desc := describe(spec.Scope, value)
	if len(desc) > maxMetadataLen {
		return nil, nil, "", fmt.Errorf("scope and instance tag of %d characters: OpenStack's description takes %d: %w", len(desc), maxMetadataLen, region.ErrRefused)
	}
	return md, []string{tag}, desc, nil
}

// encodeNetworking is the metadata of a server's networking; empty lists are empty values,
// so that an update clears what was there.
func encodeNetworking(n region.ServerNetworking) map[string]string {
	public := ""
	if n.PublicIP {
		public = "true"
	}
	return map[string]string{
		metaSecurityGroups: strings.Join(n.SecurityGroupIDs, ","),
		metaAllowed:        strings.Join(n.AllowedSourceAddresses, ","),
		metaPublicIP:       public,
	}
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// decodeSpec is the spec a server's metadata records. The name and user data are Nova's own.
func decodeSpec(md map[string]string) region.ServerSpec {
	spec := region.ServerSpec{
		Scope: region.Scope{
			OrganizationID: md[metaOrg], ProjectID: md[metaProject], RegionID: md[metaRegion], NetworkID: md[metaNetwork],
		},
		FlavorID:                  md[metaFlavor],
		ImageID:                   md[metaImage],
		SSHCertificateAuthorityID: md[metaSSHCA],
		Networking: region.ServerNetworking{
			SecurityGroupIDs:       splitList(md[metaSecurityGroups]),
			AllowedSourceAddresses: splitList(md[metaAllowed]),
			PublicIP:               md[metaPublicIP] == "true",
		},
		Tags: map[string]string{},
	}
	if v, ok := md[metaInstance]; ok {
		spec.Tags[region.InstanceTag] = v
	}
	for k, v := range md {
		if tag, ok := decodeTagKey(k); ok {
			spec.Tags[tag] = v
		}
	}
	return spec
}

// describe is the description of what the driver makes for the server of the scope and
// instance tag's value: the server, its port, its group and its floating IP.
func describe(scope region.Scope, value string) string {
	return fmt.Sprintf("%s%s/%s/%s/%s %s", descriptionPrefix, scope.OrganizationID, scope.ProjectID, scope.RegionID, scope.NetworkID, value)
}

// decodeDescription is the scope and instance tag a server's description records.
func decodeDescription(desc string) (region.Scope, string, bool) {
	rest, ok := strings.CutPrefix(desc, descriptionPrefix)
	if !ok {
		return region.Scope{}, "", false
	}
	scope, value, ok := strings.Cut(rest, " ")
	parts := strings.Split(scope, "/")
	if !ok || len(parts) != 4 {
		return region.Scope{}, "", false
	}
	return region.Scope{OrganizationID: parts[0], ProjectID: parts[1], RegionID: parts[2], NetworkID: parts[3]}, value, true
}

// Nova's task states that say what a server is in the middle of.
var taskStates = map[string]region.ServerState{
	"scheduling":           region.ServerBuilding,
	"block_device_mapping": region.ServerBuilding,
	"networking":           region.ServerBuilding,
	"spawning":             region.ServerBuilding,
	"powering-off":         region.ServerStopping,
	"powering-on":          region.ServerStarting,
	"rebooting":            region.ServerRebooting,
	"reboot_pending":       region.ServerRebooting,
	"reboot_started":       region.ServerRebooting,
	"rebooting_hard":       region.ServerRebooting,
	"reboot_pending_hard":  region.ServerRebooting,
	"reboot_started_hard":  region.ServerRebooting,
	"deleting":             region.ServerDeleting,
	"soft-deleting":        region.ServerDeleting,
}

// powerRunning is Nova's power_state of a guest that runs.
const powerRunning = 1

// serverState maps Nova's status, task state and power state to the region's state, with the
// region's word on it: the server's fault for ERROR.
func serverState(status, taskState string, power int, fault string) (region.ServerState, string) {
	if s, ok := taskStates[taskState]; ok && status != "ERROR" {
		return s, ""
	}
	switch status {
	case "BUILD":
		return region.ServerBuilding, ""
	case "ACTIVE":
		return region.ServerRunning, ""
	case "SHUTOFF":
		return region.ServerStopped, ""
	case "REBOOT", "HARD_REBOOT":
		return region.ServerRebooting, ""
	case "DELETED", "SOFT_DELETED":
		return region.ServerDeleting, ""
	case "ERROR":
		if fault == "" {
			fault = "the cloud reports the server in error"
		}
		return region.ServerError, fault
	case "UNKNOWN":
		return region.ServerError, "the cloud has lost track of the server"
	}
	// Resizing, migrating, paused, suspended, shelved, rescued: the guest runs or it does not.
	if power == powerRunning {
		return region.ServerRunning, ""
	}
	return region.ServerStopped, ""
}

// health is what the region can tell of a server's health from its state.
func health(s region.ServerState) region.ServerHealth {
	switch s {
	case region.ServerRunning:
		return region.HealthHealthy
	case region.ServerError:
		return region.HealthError
	}
	return region.HealthUnknown
}
