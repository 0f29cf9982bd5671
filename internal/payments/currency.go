package payments

import "strings"

// IsCurrency reports whether code, in lower or upper case (not mixed, as
// openapi.yaml's enum lists them), is an active ISO 4217 currency code.
// Precious metals, testing and fund codes (XAU, XTS, XXX...) are not
// accepted: they are not currencies anyone pays in.
func IsCurrency(code string) bool {
	lower := strings.ToLower(code)
	if code != lower && code != strings.ToUpper(code) {
		return false
	}
	_, ok := currencies[lower]
	return ok
}

// currencies holds the active ISO 4217 codes (list of 2025), lower-cased.
var currencies = map[string]struct{}{
	"aed": {}, "afn": {}, "all": {}, "amd": {}, "ang": {}, "aoa": {}, "ars": {}, "aud": {}, "awg": {}, "azn": {}, "bam": {}, "bbd": {},
	"bdt": {}, "bgn": {}, "bhd": {}, "bif": {}, "bmd": {}, "bnd": {}, "bob": {}, "bov": {}, "brl": {}, "bsd": {}, "btn": {}, "bwp": {},
	"byn": {}, "bzd": {}, "cad": {}, "cdf": {}, "che": {}, "chf": {}, "chw": {}, "clf": {}, "clp": {}, "cny": {}, "cop": {}, "cou": {},
	"crc": {}, "cup": {}, "cve": {}, "czk": {}, "djf": {}, "dkk": {}, "dop": {}, "dzd": {}, "egp": {}, "ern": {}, "etb": {}, "eur": {},
	"fjd": {}, "fkp": {}, "gbp": {}, "gel": {}, "ghs": {}, "gip": {}, "gmd": {}, "gnf": {}, "gtq": {}, "gyd": {}, "hkd": {}, "hnl": {},
	"htg": {}, "huf": {}, "idr": {}, "ils": {}, "inr": {}, "iqd": {}, "irr": {}, "isk": {}, "jmd": {}, "jod": {}, "jpy": {}, "kes": {},
	"kgs": {}, "khr": {}, "kmf": {}, "kpw": {}, "krw": {}, "kwd": {}, "kyd": {}, "kzt": {}, "lak": {}, "lbp": {}, "lkr": {}, "lrd": {},
	"lsl": {}, "lyd": {}, "mad": {}, "mdl": {}, "mga": {}, "mkd": {}, "mmk": {}, "mnt": {}, "mop": {}, "mru": {}, "mur": {}, "mvr": {},
	"mwk": {}, "mxn": {}, "mxv": {}, "myr": {}, "mzn": {}, "nad": {}, "ngn": {}, "nio": {}, "nok": {}, "npr": {}, "nzd": {}, "omr": {},
	"pab": {}, "pen": {}, "pgk": {}, "php": {}, "pkr": {}, "pln": {}, "pyg": {}, "qar": {}, "ron": {}, "rsd": {}, "rub": {}, "rwf": {},
	"sar": {}, "sbd": {}, "scr": {}, "sdg": {}, "sek": {}, "sgd": {}, "shp": {}, "sle": {}, "sos": {}, "srd": {}, "ssp": {}, "stn": {},
	"svc": {}, "syp": {}, "szl": {}, "thb": {}, "tjs": {}, "tmt": {}, "tnd": {}, "top": {}, "try": {}, "ttd": {}, "twd": {}, "tzs": {},
	"uah": {}, "ugx": {}, "usd": {}, "usn": {}, "uyi": {}, "uyu": {}, "uyw": {}, "uzs": {}, "ved": {}, "ves": {}, "vnd": {}, "vuv": {},
	"wst": {}, "xaf": {}, "xcd": {}, "xcg": {}, "xof": {}, "xpf": {}, "yer": {}, "zar": {}, "zmw": {}, "zwg": {},
}
