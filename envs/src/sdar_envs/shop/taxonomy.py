"""The shop's product types: category paths, attribute pools, buying options and price ranges.

Pure data in WebShop's five categories (beauty, food, fashion, electronics, garden); the catalogue
generator draws products from it and the reward's type-noun rule reads its vocabulary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# WebShop's five top-level categories (the `category` field of its products) and the root of
# their Amazon category paths.
CATEGORIES = ("beauty", "food", "fashion", "electronics", "garden")


@dataclass(frozen=True)
class Attribute:
    """A product attribute as WebShop stores it ("dry hair") and as an instruction says it.

    name: the attribute, matched by the reward ("dry hair", "sulfate free").
    phrase: how a sentence says it ("for dry hair"; equal to name for adjectives).
    post: the phrase follows the product noun ("shampoo for dry hair") instead of preceding it.
    """

    name: str
    phrase: str
    post: bool


@dataclass(frozen=True)
class ProductType:
    """One leaf of the taxonomy; every product belongs to exactly one.

    category: one of CATEGORIES (WebShop's `category`).
    path: the Amazon-style category path joined with " › " (WebShop's `product_category`).
    name: the lower-case product noun; also the product's `query` (WebShop's scraping query).
    title: the noun as it appears in product titles.
    attributes: the pool a product draws 3-5 attributes from.
    options: buying options (WebShop's `customization_options`): option name -> value pool.
    price: (low, high) dollars a product of this type costs.
    countable: singular count noun ("a shampoo" no, "a backpack" yes) for instruction wording.
    """

    category: str
    path: str
    name: str
    title: str
    attributes: tuple[Attribute, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]
    countable: bool


def _attr(spec: str) -> Attribute:
    # "for dry hair" -> name "dry hair" said after the noun; "sulfate free" -> said before it
    for prep in ("for ", "with "):
        if spec.startswith(prep):
            return Attribute(name=spec[len(prep) :], phrase=spec, post=True)
    return Attribute(name=spec, phrase=spec, post=False)


def _t(
    category: str,
    path: str,
    name: str,
    title: str,
    attrs: list[str],
    options: dict[str, list[str]] | None,
    price: tuple[float, float],
    countable: bool = False,
) -> ProductType:
    return ProductType(
        category=category,
        path=path,
        name=name,
        title=title,
        attributes=tuple(_attr(a) for a in attrs),
        options=tuple((k, tuple(v)) for k, v in (options or {}).items()),
        price=price,
        countable=countable,
    )


# option value pools (WebShop lower-cases option values; sizes are matched exactly by the reward)
# one product type per block reads better than one word per line
# fmt: off
APPAREL_COLORS = ["black", "white", "navy blue", "heather grey", "burgundy", "olive green", "pink", "khaki", "mustard yellow", "red"]
APPAREL_SIZES = ["x-small", "small", "medium", "large", "x-large", "xx-large"]
SHOE_SIZES = ["6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "11", "12"]
TECH_COLORS = ["black", "white", "silver", "rose gold", "midnight blue", "red", "green"]
HOME_COLORS = ["black", "white", "grey", "beige", "navy blue", "sage green", "walnut brown", "ivory", "charcoal"]
HAIR_SIZES = ["8 fl oz", "12 fl oz", "16.9 fl oz", "25.4 fl oz", "33.8 fl oz"]

B = "beauty & personal care"
F = "grocery & gourmet food"
C = "clothing, shoes & jewelry"
E = "electronics"
H = "home & kitchen"
G = "patio, lawn & garden"

PRODUCT_TYPES: tuple[ProductType, ...] = (
    # ---- beauty -----------------------------------------------------------------------------
    _t("beauty", f"{B} › hair care › shampoo & conditioner › shampoos", "shampoo", "Shampoo",
       ["sulfate free", "paraben free", "color safe", "cruelty free", "natural ingredients", "long lasting",
        "for dry hair", "for hair growth", "with argan oil"],
       {"size": HAIR_SIZES, "scent": ["lavender", "citrus", "coconut", "unscented", "eucalyptus", "vanilla"]}, (6, 38)),
    _t("beauty", f"{B} › hair care › shampoo & conditioner › conditioners", "conditioner", "Conditioner",
       ["sulfate free", "silicone free", "color safe", "cruelty free", "deep moisturizing", "for curly hair",
        "for damaged hair", "with shea butter"],
       {"size": HAIR_SIZES, "scent": ["lavender", "citrus", "unscented", "eucalyptus", "vanilla", "peppermint"]}, (6, 36)),
    _t("beauty", f"{B} › hair care › styling tools & appliances › hair dryers", "hair dryer", "Hair Dryer",
       ["ionic", "lightweight", "fast drying", "low noise", "foldable handle", "with diffuser", "for curly hair",
        "salon grade"],
       {"color": ["black", "white", "pink", "rose gold", "purple"]}, (19, 129), countable=True),
    _t("beauty", f"{B} › skin care › face › moisturizers", "face moisturizer", "Face Moisturizer",
       ["fragrance free", "oil free", "non comedogenic", "dermatologist tested", "anti aging",
        "with hyaluronic acid", "for sensitive skin", "for dry skin"],
       {"size": ["1 oz", "1.7 oz", "2.5 oz", "3.4 oz"]}, (9, 64), countable=True),
    _t("beauty", f"{B} › skin care › sunscreens & tanning products › sunscreens", "sunscreen", "Sunscreen Lotion",
       ["water resistant", "reef safe", "broad spectrum", "fragrance free", "non greasy", "mineral based",
        "for sensitive skin", "for kids"],
       {"size": ["3 fl oz", "5 fl oz", "6 fl oz (pack of 2)"], "style": ["spf 30", "spf 50", "spf 70"]}, (7, 34)),
    _t("beauty", f"{B} › makeup › lips › lipstick", "lipstick", "Lipstick",
       ["long lasting", "matte finish", "cruelty free", "moisturizing", "waterproof", "vegan", "transfer proof",
        "with vitamin e"],
       {"color": ["ruby red", "nude", "coral", "berry", "mauve", "plum", "pink"]}, (5, 32)),
    _t("beauty", f"{B} › makeup › face › foundation", "foundation", "Liquid Foundation",
       ["full coverage", "oil free", "long lasting", "lightweight", "natural finish", "cruelty free",
        "for oily skin", "with spf 15"],
       {"color": ["ivory", "porcelain", "beige", "honey", "caramel", "espresso"]}, (8, 48)),
    _t("beauty", f"{B} › makeup › eyes › eyeshadow", "eyeshadow palette", "Eyeshadow Palette",
       ["highly pigmented", "long lasting", "cruelty free", "shimmer finish", "matte finish", "easy to blend",
        "travel size", "with mirror"],
       {"color": ["nude", "smokey", "bronze", "rose gold", "lavender"]}, (7, 54), countable=True),
    _t("beauty", f"{B} › fragrance › women's › eau de parfum", "perfume", "Eau de Parfum Perfume",
       ["long lasting", "travel size", "floral scent", "fruity scent", "alcohol free", "gift set",
        "with vanilla notes", "for evening wear"],
       {"size": ["1 fl oz", "1.7 fl oz", "3.4 fl oz"]}, (18, 140)),
    _t("beauty", f"{B} › oral care › toothpaste", "toothpaste", "Toothpaste",
       ["fluoride free", "whitening", "natural ingredients", "fresh breath", "vegan", "sls free",
        "for sensitive teeth", "with activated charcoal"],
       {"flavor": ["mint", "cinnamon", "unflavored", "wintergreen"], "size": ["4 oz", "pack of 2", "pack of 4"]}, (3, 24)),
    _t("beauty", f"{B} › personal care › bath & bathing accessories › body washes", "body wash", "Body Wash",
       ["moisturizing", "sulfate free", "paraben free", "natural ingredients", "cruelty free", "hypoallergenic",
        "for dry skin", "with shea butter"],
       {"scent": ["lavender", "oatmeal", "citrus", "unscented", "sandalwood", "eucalyptus"],
        "size": ["16 fl oz", "22 fl oz", "pack of 2"]}, (5, 29)),
    _t("beauty", f"{B} › personal care › deodorants & antiperspirants › deodorants", "deodorant", "Deodorant Stick",
       ["aluminum free", "long lasting", "natural ingredients", "baking soda free", "vegan", "clinical strength",
        "travel size", "for sensitive skin"],
       {"scent": ["unscented", "lavender", "cedarwood", "citrus", "coconut"], "size": ["pack of 1", "pack of 2", "pack of 3"]},
       (4, 22)),
    _t("beauty", f"{B} › tools & accessories › makeup brushes & tools › brush sets", "makeup brush set", "Makeup Brush Set",
       ["synthetic bristles", "cruelty free", "easy to clean", "vegan", "high quality", "with travel case",
        "for liquid makeup"],
       {"color": ["black", "pink", "rose gold", "white", "purple"]}, (8, 46), countable=True),
    # ---- food --------------------------------------------------------------------------------
    _t("food", f"{F} › snacks & sweets › snack bars › protein bars", "protein bars", "Protein Bars",
       ["gluten free", "low sugar", "keto friendly", "high protein", "non gmo", "vegan", "soy free", "high fiber"],
       {"flavor": ["chocolate peanut butter", "cookie dough", "birthday cake", "salted caramel", "lemon"],
        "size": ["12 count", "18 count", "24 count"]}, (14, 48)),
    _t("food", f"{F} › snacks & sweets › chips & crisps › potato chips", "potato chips", "Potato Chips",
       ["gluten free", "kettle cooked", "non gmo", "low sodium", "vegan", "no artificial flavors", "with avocado oil"],
       {"flavor": ["sea salt", "barbecue", "sour cream and onion", "salt and vinegar", "jalapeno"],
        "size": ["pack of 6", "pack of 12", "pack of 24"]}, (6, 32)),
    _t("food", f"{F} › snacks & sweets › nuts & trail mixes › trail mix", "trail mix", "Trail Mix",
       ["non gmo", "gluten free", "high protein", "no added sugar", "kosher", "resealable bag", "with almonds"],
       {"flavor": ["classic", "sweet and salty", "tropical", "berry"], "size": ["12 oz", "1 lb", "2 lb", "pack of 6"]},
       (7, 36)),
    _t("food", f"{F} › meat & seafood › jerky & dried meats › beef jerky", "beef jerky", "Beef Jerky",
       ["high protein", "low sugar", "keto friendly", "gluten free", "grass fed", "preservative free",
        "individually wrapped"],
       {"flavor": ["original", "teriyaki", "peppered", "sweet and spicy", "hot and spicy"],
        "size": ["3 oz", "8 oz", "pack of 4"]}, (8, 42)),
    _t("food", f"{F} › beverages › coffee, tea & cocoa › ground coffee", "ground coffee", "Ground Coffee",
       ["organic", "fair trade", "low acid", "100% arabica", "kosher", "single origin", "small batch roasted"],
       {"size": ["12 oz", "24 oz", "2 lb"], "style": ["light roast", "medium roast", "dark roast"]}, (8, 39)),
    _t("food", f"{F} › beverages › coffee, tea & cocoa › green tea", "green tea", "Green Tea Bags",
       ["organic", "non gmo", "sugar free", "gluten free", "kosher", "antioxidant rich", "individually wrapped",
        "with matcha"],
       {"flavor": ["original", "jasmine", "lemon", "honey ginger", "mint"], "size": ["20 count", "40 count", "100 count"]},
       (4, 26)),
    _t("food", f"{F} › beverages › bottled beverages, water & drink mixes › sparkling water", "sparkling water",
       "Sparkling Water",
       ["zero calorie", "sugar free", "caffeine free", "naturally flavored", "sodium free", "non gmo", "bpa free"],
       {"flavor": ["lime", "grapefruit", "black cherry", "lemon", "mango", "unflavored"],
        "size": ["pack of 8", "pack of 12", "pack of 24"]}, (5, 30)),
    _t("food", f"{F} › pantry staples › cooking oils › olive oil", "olive oil", "Olive Oil",
       ["extra virgin", "cold pressed", "organic", "non gmo", "kosher", "single origin", "first harvest",
        "high polyphenol"],
       {"size": ["16.9 fl oz", "25.4 fl oz", "33.8 fl oz", "pack of 2"]}, (9, 58)),
    _t("food", f"{F} › pantry staples › jams, jellies & sweet spreads › honey", "honey", "Honey",
       ["raw", "organic", "unfiltered", "non gmo", "kosher", "gluten free", "pure", "unpasteurized"],
       {"size": ["12 oz", "16 oz", "32 oz", "5 lb"]}, (6, 49)),
    _t("food", f"{F} › snacks & sweets › chocolate › dark chocolate", "dark chocolate", "Dark Chocolate Bar",
       ["sugar free", "keto friendly", "vegan", "fair trade", "organic", "gluten free", "individually wrapped",
        "non gmo"],
       {"flavor": ["sea salt", "almond", "orange", "mint", "raspberry", "espresso"],
        "size": ["pack of 4", "pack of 10", "pack of 12"]}, (5, 34)),
    _t("food", f"{F} › snacks & sweets › candy › gummy candy", "gummy candy", "Gummy Candy",
       ["vegan", "gluten free", "fat free", "gelatin free", "kosher", "individually wrapped",
        "with natural flavors", "for party favors"],
       {"flavor": ["assorted fruit", "sour", "cherry", "watermelon", "peach"], "size": ["1 lb", "2 lb", "5 lb"]}, (4, 29)),
    _t("food", f"{F} › pantry staples › baking mixes", "baking mix", "Baking Mix",
       ["keto friendly", "gluten free", "sugar free", "low carb", "non gmo", "all natural", "vegan",
        "with almond flour"],
       {"flavor": ["chocolate", "vanilla", "blueberry", "banana", "pumpkin"], "size": ["9 oz", "pack of 2", "pack of 3"]},
       (5, 27)),
    # ---- fashion -----------------------------------------------------------------------------
    _t("fashion", f"{C} › women › clothing › dresses", "women's dress", "Women's Dress",
       ["machine wash", "short sleeve", "long sleeve", "elastic waist", "v neck", "floral print", "a line",
        "with pockets"],
       {"color": APPAREL_COLORS, "size": APPAREL_SIZES}, (16, 58), countable=True),
    _t("fashion", f"{C} › women › clothing › active › leggings", "women's leggings", "Women's Leggings",
       ["high waist", "tummy control", "moisture wicking", "squat proof", "machine wash", "quick drying",
        "buttery soft", "with pockets"],
       {"color": APPAREL_COLORS, "size": APPAREL_SIZES}, (12, 42)),
    _t("fashion", f"{C} › men › clothing › shirts › t-shirts", "men's t-shirt", "Men's T-Shirt",
       ["short sleeve", "long sleeve", "cotton", "machine wash", "slim fit", "regular fit", "crew neck",
        "moisture wicking", "with chest pocket"],
       {"color": APPAREL_COLORS, "size": APPAREL_SIZES}, (8, 32), countable=True),
    _t("fashion", f"{C} › men › clothing › fashion hoodies & sweatshirts", "men's hoodie", "Men's Hoodie",
       ["fleece lined", "machine wash", "long sleeve", "regular fit", "full zip", "pullover", "with pockets",
        "with drawstring"],
       {"color": APPAREL_COLORS, "size": APPAREL_SIZES}, (19, 62), countable=True),
    _t("fashion", f"{C} › men › clothing › jeans", "men's jeans", "Men's Jeans",
       ["slim fit", "straight leg", "stretch", "machine wash", "relaxed fit", "button closure", "classic fit"],
       {"color": ["light wash", "medium wash", "dark wash", "black", "grey"],
        "size": ["30w x 30l", "32w x 30l", "32w x 32l", "34w x 32l", "36w x 32l", "38w x 34l"]}, (22, 69)),
    _t("fashion", f"{C} › men › shoes › athletic › running", "running shoes", "Running Shoes",
       ["lightweight", "breathable", "non slip", "rubber sole", "memory foam", "shock absorbing",
        "with arch support", "with wide toe box"],
       {"color": ["black", "white", "grey", "navy blue", "red", "olive green"], "size": SHOE_SIZES}, (29, 119)),
    _t("fashion", f"{C} › women › shoes › sandals", "women's sandals", "Women's Sandals",
       ["open toe", "ankle strap", "non slip", "rubber sole", "lightweight", "memory foam", "with arch support"],
       {"color": ["black", "white", "beige", "brown", "gold", "silver"], "size": SHOE_SIZES}, (14, 66)),
    _t("fashion", f"{C} › women › shoes › boots › snow boots", "winter boots", "Winter Boots",
       ["waterproof", "fur lined", "non slip", "rubber sole", "insulated", "lace up", "mid calf"],
       {"color": ["black", "brown", "grey", "khaki", "white"], "size": SHOE_SIZES}, (32, 129)),
    _t("fashion", f"{C} › luggage & travel gear › backpacks", "backpack", "Backpack",
       ["water resistant", "lightweight", "large capacity", "anti theft", "with usb charging port",
        "with laptop compartment", "for travel"],
       {"color": ["black", "grey", "navy blue", "khaki", "pink", "olive green"]}, (19, 79), countable=True),
    _t("fashion", f"{C} › men › accessories › wallets", "wallet", "Wallet",
       ["rfid blocking", "genuine leather", "slim", "minimalist", "bifold", "with coin pocket", "with gift box",
        "with id window"],
       {"color": ["black", "brown", "tan", "navy blue", "grey"]}, (9, 59), countable=True),
    _t("fashion", f"{C} › women › accessories › sunglasses & eyewear", "sunglasses", "Sunglasses",
       ["polarized", "uv protection", "lightweight", "oversized", "retro", "metal frame", "with case", "for driving"],
       {"color": ["black", "tortoise", "gold", "silver", "pink", "blue"]}, (9, 89)),
    _t("fashion", f"{C} › men › watches › wrist watches", "wrist watch", "Wrist Watch",
       ["water resistant", "stainless steel", "quartz movement", "minimalist", "luminous hands",
        "with leather band", "with gift box", "with date display"],
       {"color": ["black", "silver", "gold", "rose gold", "blue"]}, (24, 189), countable=True),
    # ---- electronics ----------------------------------------------------------------------
    _t("electronics", f"{E} › headphones, earbuds & accessories › earbud headphones", "wireless earbuds",
       "Wireless Earbuds",
       ["noise cancelling", "water resistant", "long battery life", "touch control", "stereo sound",
        "with charging case", "with microphone", "for running"],
       {"color": TECH_COLORS}, (19, 149)),
    _t("electronics", f"{E} › portable audio & video › portable bluetooth speakers", "bluetooth speaker",
       "Bluetooth Speaker",
       ["waterproof", "portable", "long battery life", "stereo sound", "deep bass", "with microphone", "for outdoor"],
       {"color": TECH_COLORS}, (19, 129), countable=True),
    _t("electronics", f"{E} › cell phones & accessories › cases, holsters & sleeves › basic cases", "phone case",
       "Phone Case",
       ["shockproof", "slim fit", "drop protection", "wireless charging compatible", "anti scratch",
        "with card holder", "with kickstand", "with screen protector"],
       {"color": ["black", "clear", "pink", "midnight blue", "purple", "green"]}, (6, 29), countable=True),
    _t("electronics", f"{E} › cell phones & accessories › accessories › cables", "usb c cable", "USB C Cable",
       ["fast charging", "nylon braided", "fast data transfer", "tangle free", "heavy duty", "with led indicator"],
       {"size": ["3 ft", "6 ft", "10 ft"], "color": ["black", "white", "grey", "red", "blue"]}, (6, 24), countable=True),
    _t("electronics", f"{E} › cell phones & accessories › chargers & power adapters › portable power banks",
       "power bank", "Power Bank",
       ["fast charging", "compact", "high capacity", "lightweight", "with led display", "with usb c port",
        "with wireless charging", "with built in cables"],
       {"size": ["10000mah", "20000mah", "26800mah"], "color": ["black", "white", "blue", "pink"]}, (15, 69), countable=True),
    _t("electronics", f"{E} › computers & accessories › cables & accessories › hdmi cables", "hdmi cable", "HDMI Cable",
       ["4k hdr", "high speed", "gold plated", "nylon braided", "with ethernet", "for gaming"],
       {"size": ["3 ft", "6 ft", "10 ft", "15 ft", "25 ft"]}, (6, 34), countable=True),
    _t("electronics", f"{E} › computers & accessories › keyboards, mice & accessories › keyboards", "wireless keyboard",
       "Wireless Keyboard",
       ["ergonomic", "rechargeable", "backlit", "quiet keys", "compact", "spill resistant", "for mac",
        "with number pad"],
       {"color": ["black", "white", "silver", "pink"]}, (19, 99), countable=True),
    _t("electronics", f"{E} › computers & accessories › keyboards, mice & accessories › mice", "wireless mouse",
       "Wireless Mouse",
       ["ergonomic", "rechargeable", "silent click", "adjustable dpi", "with usb receiver", "for laptop"],
       {"color": ["black", "white", "grey", "pink", "blue"]}, (8, 59), countable=True),
    _t("electronics", f"{E} › computers & accessories › data storage › usb flash drives", "usb flash drive",
       "USB Flash Drive",
       ["high speed", "usb 3.0", "waterproof", "shockproof", "metal casing", "plug and play", "with keychain",
        "with lanyard"],
       {"size": ["32gb", "64gb", "128gb", "256gb"]}, (6, 44), countable=True),
    _t("electronics", f"{E} › wearable technology › smartwatches", "smart watch", "Smart Watch",
       ["water resistant", "long battery life", "with heart rate monitor", "with sleep tracking", "with gps",
        "with blood oxygen monitor", "for android phones"],
       {"color": ["black", "silver", "pink", "midnight blue", "green"]}, (29, 199), countable=True),
    _t("electronics", f"{E} › computers & accessories › webcams", "webcam", "Webcam",
       ["1080p", "wide angle", "plug and play", "auto focus", "low light correction", "with microphone",
        "with privacy cover", "for streaming"],
       None, (19, 99), countable=True),
    # ---- garden (home, furniture, patio) --------------------------------------------------------
    _t("garden", f"{H} › furniture › home office furniture › home office chairs", "office chair", "Office Chair",
       ["ergonomic", "adjustable height", "mesh back", "swivel", "easy assembly", "with lumbar support",
        "with armrests", "with headrest"],
       {"color": HOME_COLORS}, (59, 289), countable=True),
    _t("garden", f"{H} › furniture › living room furniture › bookcases", "bookshelf", "Bookshelf",
       ["easy assembly", "solid wood", "industrial style", "space saving", "5 tier", "for living room",
        "with drawers"],
       {"color": HOME_COLORS}, (39, 199), countable=True),
    _t("garden", f"{H} › furniture › living room furniture › tables › coffee tables", "coffee table", "Coffee Table",
       ["solid wood", "easy assembly", "mid century modern", "tempered glass", "industrial style", "with storage",
        "with lift top", "for living room"],
       {"color": HOME_COLORS}, (49, 259), countable=True),
    _t("garden", f"{H} › furniture › kitchen & dining room furniture › barstools", "bar stools", "Bar Stools",
       ["adjustable height", "swivel", "faux leather", "set of 2", "easy assembly", "with back",
        "for kitchen island"],
       {"color": HOME_COLORS, "size": ["24 inch", "26 inch", "30 inch"]}, (59, 249)),
    _t("garden", f"{H} › bedding › sheets & pillowcases › sheet & pillowcase sets", "bed sheets", "Bed Sheets Set",
       ["deep pocket", "breathable", "wrinkle free", "cooling", "hypoallergenic", "egyptian cotton",
        "machine washable", "fade resistant"],
       {"color": HOME_COLORS, "size": ["twin", "full", "queen", "king", "california king"]}, (19, 119)),
    _t("garden", f"{H} › bedding › bed pillows & positioners › bed pillows", "bed pillow", "Bed Pillow",
       ["memory foam", "cooling", "hypoallergenic", "adjustable loft", "down alternative", "with washable cover",
        "for side sleepers", "for neck pain"],
       {"size": ["standard", "queen", "king"]}, (15, 89), countable=True),
    _t("garden", f"{H} › bedding › blankets & throws › throws", "throw blanket", "Throw Blanket",
       ["super soft", "lightweight", "machine washable", "flannel fleece", "all season", "with tassels",
        "for couch"],
       {"color": HOME_COLORS, "size": ["50 x 60 inch", "60 x 80 inch", "90 x 90 inch"]}, (12, 59), countable=True),
    _t("garden", f"{H} › home décor › window treatments › curtains & drapes", "curtains", "Curtains",
       ["blackout", "thermal insulated", "grommet top", "noise reducing", "machine washable", "for bedroom",
        "for living room"],
       {"color": HOME_COLORS, "size": ["42 x 63 inch", "52 x 84 inch", "52 x 95 inch"]}, (15, 79)),
    _t("garden", f"{H} › home décor › area rugs, runners & pads › area rugs", "area rug", "Area Rug",
       ["non slip", "machine washable", "stain resistant", "low pile", "shaggy", "boho style", "for living room",
        "for bedroom"],
       {"color": HOME_COLORS, "size": ["2 x 3 ft", "3 x 5 ft", "5 x 7 ft", "8 x 10 ft"]}, (19, 229), countable=True),
    _t("garden", f"{H} › kitchen & dining › dining & entertaining › cups, mugs & saucers › coffee mugs", "coffee mug",
       "Coffee Mug",
       ["microwave safe", "dishwasher safe", "ceramic", "insulated", "lead free", "stackable", "with lid",
        "with gift box"],
       {"color": HOME_COLORS, "size": ["12 oz", "16 oz", "20 oz"]}, (8, 34), countable=True),
    _t("garden", f"{H} › kitchen & dining › storage & organization › food storage containers", "food storage containers",
       "Food Storage Containers",
       ["bpa free", "airtight", "microwave safe", "dishwasher safe", "stackable", "leak proof", "freezer safe",
        "with lids"],
       {"size": ["10 piece", "24 piece", "36 piece"]}, (14, 59)),
    _t("garden", f"{G} › gardening & lawn care › pots, planters & container accessories › planters", "planter",
       "Planter Pot",
       ["ceramic", "self watering", "modern", "frost resistant", "with drainage hole", "with saucer",
        "for indoor plants", "for succulents"],
       {"color": HOME_COLORS, "size": ["4 inch", "6 inch", "8 inch", "10 inch"]}, (9, 69), countable=True),
    _t("garden", f"{G} › outdoor décor › outdoor lighting › pathway lights", "solar lights", "Solar Lights",
       ["waterproof", "solar powered", "auto on off", "warm white", "easy installation", "for pathway",
        "with motion sensor"],
       {"size": ["pack of 4", "pack of 6", "pack of 8", "pack of 12"]}, (14, 69)),
)
# fmt: on

TYPES_BY_NAME: dict[str, ProductType] = {t.name: t for t in PRODUCT_TYPES}

_WORD = re.compile(r"[a-z]+")

# Words that never count as product-type nouns in the reward's title score: WebShop keeps only
# spaCy NOUN/PROPN tokens; without a spaCy model we drop the attribute vocabulary (adjectives and
# modifiers) instead, keeping any word that also names a product type ("hair" in "hair dryer").
_TYPE_WORDS = {w for t in PRODUCT_TYPES for w in _WORD.findall(t.title.lower())}
MODIFIER_WORDS: frozenset[str] = frozenset(
    {w for t in PRODUCT_TYPES for a in t.attributes for w in _WORD.findall(a.name)} - _TYPE_WORDS
)
